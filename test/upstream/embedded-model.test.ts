import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fromJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createEmbeddedScorer } from "../../src/decision/embedded-scorer.js";
import { createDecisionEngine, firstCallMessages, type QuestionSpec } from "../../src/decision/engine.js";
import { letterLabels, NOUL_LABELS, scoreLabels } from "../../src/decision/labels.js";
import { buildMessages, choiceBlock, noulBlock, renderState, scoreBlock } from "../../src/decision/prompt.js";
import { createLogger } from "../../src/logger.js";
import { loadEmbeddedModel, SHARED_SEQUENCE_TOKENS, type EmbeddedModel } from "../../src/upstream/embedded-model.js";
import { LlmCallError } from "../../src/upstream/model-call.js";
import { openReference, type Reference } from "../support/embedded-reference.js";
import { writeTinyGguf } from "../support/tiny-gguf.js";

const STATE = renderState(fromJson(ValueSchema, { ticket: "I was charged twice", customer: { plan: "pro" } }));
const logger = createLogger("silent");
let dir: string;
let model: EmbeddedModel;
let reference: Reference;

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-embedded-"));
  const file = writeTinyGguf(path.join(dir, "tiny.gguf"));
  model = await loadEmbeddedModel(file, { contextTokens: 2048, sequences: 2, threads: 1 }, logger);
  reference = await openReference(file);
});
afterAll(async () => {
  await model?.dispose();
  await reference?.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

const call = () => ({ signal: new AbortController().signal, deadlineMs: Date.now() + 20_000 });
const normalized = (ps: number[]) => ps.map((p) => p / ps.reduce((a, b) => a + b, 0));
const engine = () => createDecisionEngine({ scorer: createEmbeddedScorer(model), logger });
/**
 * llama.cpp's sums depend on how tokens were batched: a prompt read in one
 * batch matches the reference to 1e-9 (first test), one read after a cached
 * prefix to within a few tenths of a percent. Anything wrong in the readout
 * (a missed spelling, a continuation left out, a wrong normalizer) is far
 * outside this.
 */
const RELATIVE = 1e-2;
function expectNear(actual: number, expected: number) {
  expect(Math.abs(actual - expected)).toBeLessThanOrEqual(RELATIVE * Math.abs(expected) + 5e-4);
}

describe("the tiny model's vocabulary gives the cases the scorer must handle", () => {
  it("has single-token and multi-token label spellings", () => {
    expect(reference.tokenize("yes")).toHaveLength(1);
    expect(reference.tokenize(" YES").length).toBeGreaterThan(1);
    expect(reference.tokenize(" A")).toHaveLength(1);
    expect(reference.tokenize(" E").length).toBeGreaterThan(1);
    expect(reference.tokenize(" 4").length).toBeGreaterThan(1);
  });
});

describe("scoreLabels reads the whole distribution exactly", () => {
  it("equals node-llama-cpp's own probabilities, continuations of multi-token spellings included", async () => {
    const messages = buildMessages(STATE, choiceBlock("Which team?", letterLabels(6).symbols.map((s, i) => ({ symbol: s, text: `team ${i}` }))).text);
    const spellings = letterLabels(6).spellings;
    const scored = await model.scoreLabels({ messages, spellings }, call());
    const expected = await reference.labelProbabilities(messages, spellings);
    expect(scored.probabilities).toHaveLength(6);
    // The scorer reads the first tokens and the shared continuation ("▁" of " D", " E", " F") from one batch of the
    // prompt and "▁"; the reference evaluates the prompt alone for single-token spellings. llama.cpp's sums then differ
    // in the last digits (about 1e-7 relative), a missed spelling or continuation by far more.
    for (const [i, p] of scored.probabilities.entries()) expect(Math.abs(p - expected[i]!)).toBeLessThanOrEqual(1e-5 * expected[i]!);
    // The mass is the true share of the labels: far from both 0 and 1 with these weights.
    const mass = scored.probabilities.reduce((a, b) => a + b, 0);
    expect(mass).toBeGreaterThan(0);
    expect(mass).toBeLessThan(1);
    expect(scored.usage.promptTokens).toBe(model.promptTokens(messages).length);
  });
});

describe("decide on the embedded model", () => {
  it("answers noul, choice (single- and multi-token labels) and score as the reference computes them", async () => {
    const questions: QuestionSpec[] = [
      { key: "urgent", type: "noul", instructions: "Is it urgent?" },
      { key: "team", type: "choice", instructions: "Which team?", options: ["billing", "technical", "sales", "legal", "press"] },
      { key: "impact", type: "score", instructions: "How big is the impact?", labels: ["none", "low", "some", "high", "huge"] },
    ];
    const outcome = await engine().decide({ stateBlock: STATE, questions }, call());
    const answers = Object.fromEntries(outcome.answers);

    const noulRef = await reference.labelProbabilities(buildMessages(STATE, noulBlock("Is it urgent?").text), NOUL_LABELS.spellings);
    expect(Object.keys(answers.urgent!).sort()).toEqual(["noul", "type", "xLabelMass", "xMethod"]);
    expect(answers.urgent).toMatchObject({ type: "noul", xMethod: "logprobs" });
    expectNear((answers.urgent as { noul: number }).noul, normalized(noulRef)[0]!);
    expectNear((answers.urgent as { xLabelMass: number }).xLabelMass, noulRef[0]! + noulRef[1]!);

    const letters = letterLabels(5);
    const teamMessages = buildMessages(STATE, choiceBlock("Which team?", letters.symbols.map((s, i) => ({ symbol: s, text: (questions[1] as { options: string[] }).options[i]! }))).text);
    const teamRef = normalized(await reference.labelProbabilities(teamMessages, letters.spellings));
    const team = answers.team as { probabilities: Record<string, number>; choice: string };
    Object.values(team.probabilities).forEach((p, i) => expectNear(p, teamRef[i]!));
    expect(team.choice).toBe(["billing", "technical", "sales", "legal", "press"][teamRef.indexOf(Math.max(...teamRef))]);

    const levels = scoreLabels(5);
    const impactMessages = buildMessages(STATE, scoreBlock("How big is the impact?", levels.symbols.map((s, i) => ({ symbol: s, text: ["none", "low", "some", "high", "huge"][i]! }))).text);
    const impactRef = normalized(await reference.labelProbabilities(impactMessages, levels.spellings));
    const impact = answers.impact as { probabilities: Record<string, number>; score: number; xMethod: string };
    Object.values(impact.probabilities).forEach((p, i) => expectNear(p, impactRef[i]!));
    expectNear(impact.score, impactRef.reduce((s, p, i) => s + i * p, 0));
    expect(impact).not.toHaveProperty("xUnseen");

    expect(outcome.answered).toBe(3);
    expect(outcome.usage.upstreamCalls).toBe(3);
  });

  it("answers 40 questions in one call over one evaluated prefix", async () => {
    const questions: QuestionSpec[] = Array.from({ length: 40 }, (_, i) => ({ key: `q${i}`, type: "noul", instructions: `Is statement ${i} true?` }));
    const outcome = await engine().decide({ stateBlock: STATE, questions }, call());
    expect(outcome.answered).toBe(40);
    for (const i of [0, 17, 39]) {
      const ref = normalized(await reference.labelProbabilities(buildMessages(STATE, noulBlock(`Is statement ${i} true?`).text), NOUL_LABELS.spellings));
      expectNear((Object.fromEntries(outcome.answers)[`q${i}`] as { noul: number }).noul, ref[0]!);
    }
    // Only the first question on each sequence evaluates the state; the rest reuse it.
    const prompt = model.promptTokens(buildMessages(STATE, noulBlock("Is statement 0 true?").text)).length;
    expect(outcome.usage.inputTokens).toBeGreaterThanOrEqual(40 * (prompt - 2));
    expect(outcome.usage.cachedInputTokens).toBeGreaterThan(0.8 * outcome.usage.inputTokens);
  });

  it("evaluates a request's shared prefix once whatever sequence each question lands on, and each question's own tokens once", async () => {
    const state = renderState(fromJson(ValueSchema, `a state seen once: ${"the customer was charged twice ".repeat(8)}`));
    const questions: QuestionSpec[] = Array.from({ length: 12 }, (_, i) => ({ key: `q${i}`, type: "noul", instructions: `Is statement ${i} true?` }));
    const prompts = questions.map((q) => model.promptTokens(firstCallMessages(state, q)));
    const prefixes = new Set(prompts.flatMap((p) => p.map((_, i) => p.slice(0, i + 1).join(","))));
    const before = model.tokensEvaluated();
    const outcome = await engine().decide({ stateBlock: state, questions }, call());
    const evaluated = model.tokensEvaluated() - before;
    expect(outcome.answered).toBe(12);
    // Every prompt token once (but the start the earlier tests' prompts share, still held); beyond them, one token per
    // question: the shared first token ("▁") of the multi-token spellings.
    const earlier = model.promptTokens(firstCallMessages(STATE, questions[0]!));
    const held = prompts[0]!.findIndex((t, i) => t !== earlier[i]);
    expect(evaluated).toBeGreaterThanOrEqual(prefixes.size - held);
    expect(evaluated).toBeLessThanOrEqual(prefixes.size + questions.length);
    // Questions on the sequence that received a copy of the other's cache read what the reference reads.
    const answers = Object.fromEntries(outcome.answers);
    for (const i of [1, 11]) {
      const ref = normalized(await reference.labelProbabilities(firstCallMessages(state, questions[i]!), NOUL_LABELS.spellings));
      expectNear((answers[`q${i}`] as { noul: number }).noul, ref[0]!);
    }
  }, 120_000);

  it("serves concurrent calls on one model, each answer its own", async () => {
    const run = (i: number) =>
      engine().decide({ stateBlock: renderState(fromJson(ValueSchema, `state number ${i}`)), questions: [{ key: "q", type: "noul", instructions: "Is it so?" }] }, call());
    const outcomes = await Promise.all([0, 1, 2, 3, 4].map(run));
    for (const [i, outcome] of outcomes.entries()) {
      const ref = normalized(
        await reference.labelProbabilities(buildMessages(renderState(fromJson(ValueSchema, `state number ${i}`)), noulBlock("Is it so?").text), NOUL_LABELS.spellings),
      );
      expectNear((outcome.answers[0]![1] as { noul: number }).noul, ref[0]!);
    }
  });

  it("stops a cancelled call: it rejects as aborted and the model keeps serving", async () => {
    const controller = new AbortController();
    const long = buildMessages(renderState(fromJson(ValueSchema, "word ".repeat(300))), noulBlock("Is it?").text);
    const pending = model.scoreLabels({ messages: long, spellings: NOUL_LABELS.spellings }, { signal: controller.signal, deadlineMs: Date.now() + 20_000 });
    controller.abort();
    await expect(pending).rejects.toEqual(new LlmCallError("aborted", false));
    const after = await model.scoreLabels({ messages: buildMessages(STATE, noulBlock("Is it?").text), spellings: NOUL_LABELS.spellings }, call());
    expectNear(after.probabilities[0]!, (await reference.labelProbabilities(buildMessages(STATE, noulBlock("Is it?").text), NOUL_LABELS.spellings))[0]!);
  });

  it("answers a question whose prompt nearly fills a sequence, as the reference reads it", async () => {
    const long = buildMessages(renderState(fromJson(ValueSchema, "word ".repeat(330))), noulBlock("Is it?").text);
    const length = model.promptTokens(long).length;
    expect(length).toBeGreaterThan(1900);
    expect(length + 8).toBeLessThanOrEqual(2048);
    // Two one-token spellings keep the reference's work (a full evaluation per spelling) short.
    const spellings = [["yes"], ["no"]];
    const scored = await model.scoreLabels({ messages: long, spellings }, call());
    const expected = await reference.labelProbabilities(long, spellings);
    scored.probabilities.forEach((p, i) => expectNear(p, expected[i]!));
  }, 120_000);

  it("answers a prompt longer than a shared sequence holds in a context of its own, as the reference reads it", async () => {
    // Shared sequences hold SHARED_SEQUENCE_TOKENS; the per-question limit here is twice that.
    const roomy = await loadEmbeddedModel(writeTinyGguf(path.join(dir, "roomy.gguf")), { contextTokens: 2 * SHARED_SEQUENCE_TOKENS, sequences: 2, threads: 1 }, logger);
    try {
      const long = buildMessages(renderState(fromJson(ValueSchema, "word ".repeat(500))), noulBlock("Is it?").text);
      const length = roomy.promptTokens(long).length;
      expect(length).toBeGreaterThan(SHARED_SEQUENCE_TOKENS);
      expect(length + 8).toBeLessThanOrEqual(2 * SHARED_SEQUENCE_TOKENS);
      const spellings = [["yes"], ["no"]];
      const expected = await reference.labelProbabilities(long, spellings);
      // Two at once: the second waits for the first and reuses its context.
      const [first, second] = await Promise.all([roomy.scoreLabels({ messages: long, spellings }, call()), roomy.scoreLabels({ messages: long, spellings }, call())]);
      first.probabilities.forEach((p, i) => expectNear(p, expected[i]!));
      second.probabilities.forEach((p, i) => expectNear(p, expected[i]!));
      // Every prompt token once: the second call found them held.
      expect(roomy.tokensEvaluated()).toBeLessThanOrEqual(length + 2);
      // The context was freed; a later long prompt gets a new one and is read the same.
      const again = await roomy.scoreLabels({ messages: long, spellings }, call());
      again.probabilities.forEach((p, i) => expectNear(p, expected[i]!));
      expect(again.usage.cachedTokens).toBe(0);
      // A short prompt meanwhile goes to the shared sequences.
      const short = await roomy.scoreLabels({ messages: buildMessages(STATE, noulBlock("Is it?").text), spellings: NOUL_LABELS.spellings }, call());
      expectNear(short.probabilities[0]!, (await reference.labelProbabilities(buildMessages(STATE, noulBlock("Is it?").text), NOUL_LABELS.spellings))[0]!);
    } finally {
      await roomy.dispose();
    }
  }, 120_000);

  it("refuses a prompt longer than a sequence holds, without evaluating it", async () => {
    const huge = buildMessages(renderState(fromJson(ValueSchema, "word ".repeat(3000))), noulBlock("Is it?").text);
    await expect(model.scoreLabels({ messages: huge, spellings: NOUL_LABELS.spellings }, call())).rejects.toEqual(new LlmCallError("rejected", false));
  });
});
