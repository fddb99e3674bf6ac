import { fromJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { describe, expect, it, onTestFinished } from "vitest";
import { createDecisionEngine, type QuestionSpec } from "../../src/decision/engine.js";
import { createUpstreamScorer } from "../../src/decision/upstream-scorer.js";
import { renderState, SYSTEM_PROMPT } from "../../src/decision/prompt.js";
import { createLogger } from "../../src/logger.js";
import { createLlmClient } from "../../src/upstream/llm-client.js";
import {
  fakeLlmConfig,
  isProbe,
  logprobsReply,
  routeByMarker,
  startFakeLlm,
  textReply,
  userContent,
  vllmMaxLogprobs,
  type FakeHandler,
} from "../support/fake-llm.js";

const STATE = renderState(fromJson(ValueSchema, { ticket: "I was charged twice", customer: { plan: "pro" } }));

async function decide(handler: FakeHandler, questions: QuestionSpec[]) {
  const fake = await startFakeLlm(handler);
  onTestFinished(() => fake.close());
  const logger = createLogger("silent");
  const engine = createDecisionEngine({ scorer: createUpstreamScorer(createLlmClient({ config: fakeLlmConfig(fake, { maxConcurrentCalls: 64 }), logger })), logger });
  const outcome = await engine.decide({ stateBlock: STATE, questions }, { signal: new AbortController().signal, deadlineMs: Date.now() + 5_000 });
  return { outcome, answers: Object.fromEntries(outcome.answers), fake };
}

const questions: QuestionSpec[] = [
  { key: "urgent", type: "noul", instructions: "Is it urgent?" },
  { key: "team", type: "choice", instructions: "Which team?", options: ["billing", "technical", "sales"] },
  { key: "impact", type: "score", instructions: "How big is the impact?", labels: ["none", "low", "high"] },
];

describe("logprobs path", () => {
  it("answers every type from the window, with one identical prefix and the exact request", async () => {
    const { outcome, answers, fake } = await decide(
      routeByMarker({
        "Is it urgent?": () => logprobsReply({ yes: 0.5, " Yes": 0.2, no: 0.2, Maybe: 0.1 }, { prompt: 120, cached: 0 }),
        "Which team?": () => logprobsReply({ A: 0.7, " A": 0.1, B: 0.1, a: 0.1 }, { prompt: 130, cached: 100 }),
        "How big": () => logprobsReply({ "0": 0.1, "1": 0.3, "2": 0.5, "3": 0.1 }, { prompt: 140, cached: 100 }),
      }),
      questions,
    );
    expect(answers.urgent).toEqual({ type: "noul", noul: 0.777778, xLabelMass: 0.9, xMethod: "logprobs" });
    expect(answers.team).toEqual({
      type: "choice",
      choice: "billing",
      probabilities: { billing: 0.888889, technical: 0.111111, sales: 0 },
      confidence: 0.833333,
      xLabelMass: 0.9,
      xMethod: "logprobs",
      xUnseen: 1,
      xUnseenMassMax: 0,
    });
    expect(answers.impact).toMatchObject({
      type: "score",
      score: 1.444444,
      legend: { "0": "none", "1": "low", "2": "high" },
      probabilities: { "0": 0.111111, "1": 0.333333, "2": 0.555556 },
      xLabel: "high",
      xIndex: 2,
      xLabelMass: 0.9,
    });
    expect(outcome.usage).toEqual({ inputTokens: 390, outputTokens: 3, cachedInputTokens: 200, upstreamCalls: 3 });
    expect(outcome.answered).toBe(3);

    const sent = fake.questionRequests();
    expect(sent).toHaveLength(3);
    for (const r of sent) {
      expect(r.body).toMatchObject({ max_tokens: 1, logprobs: true, top_logprobs: 20, temperature: 1, top_p: 1, model: "fake-model" });
      expect(r.body.messages[0]).toEqual({ role: "system", content: SYSTEM_PROMPT });
      expect(userContent(r).startsWith(`${STATE}\n\n<question>\n`)).toBe(true);
    }
    const prefixes = sent.map((r) => JSON.stringify(r.body.messages).split("<question>")[0]);
    expect(new Set(prefixes).size).toBe(1);
    const choice = userContent(sent.find((r) => userContent(r).includes("Which team?"))!);
    expect(choice).toContain("Options:\nA: billing\nB: technical\nC: sales\n\nAnswer with exactly one letter (A, B or C).");
    const score = userContent(sent.find((r) => userContent(r).includes("How big"))!);
    expect(score).toContain("0: none\n1: low\n2: high\n\nAnswer with exactly one digit from 0 to 2.");
  });

  it("retries once with the closing line repeated when no label came back, and bills only the answering call", async () => {
    const { outcome, answers, fake } = await decide(
      routeByMarker({
        "Is it urgent?": (_r, n) => (n === 1 ? logprobsReply({ The: 0.9, I: 0.1 }, { prompt: 100 }) : logprobsReply({ no: 1 }, { prompt: 111 })),
      }),
      [questions[0]!],
    );
    expect(answers.urgent).toMatchObject({ type: "noul", noul: 0 });
    expect(outcome.usage).toMatchObject({ inputTokens: 111, upstreamCalls: 1 });
    const [first, second] = fake.questionRequests();
    expect(userContent(second!)).toBe(`${userContent(first!)}\nAnswer with exactly one word: yes or no.`);
  });

  it.each([
    { name: "no label twice", reply: () => logprobsReply({ Hello: 1 }), expected: { code: "no_signal", retryable: true } },
    { name: "a reasoning opener twice", reply: () => logprobsReply({ "<think>": 0.9, yes: 0.1 }), expected: { code: "no_signal", retryable: true } },
    { name: "a refusal", reply: () => logprobsReply({ I: 1 }, { refusal: "I can't help with that." }), expected: { code: "refusal", retryable: false } },
    { name: "an upstream 500", reply: () => ({ status: 500, text: "boom" }), expected: { code: "upstream_error", retryable: true } },
    { name: "a 400", reply: () => ({ status: 400, text: "context length exceeded" }), expected: { code: "upstream_error", retryable: false } },
  ])("turns $name into a per-question error while the others answer", async ({ reply, expected }) => {
    const { outcome, answers } = await decide(
      routeByMarker({ "Is it urgent?": reply, "Which team?": () => logprobsReply({ C: 1 }, { prompt: 50 }) }),
      questions.slice(0, 2),
    );
    expect(answers.urgent).toEqual({ type: "error", message: expect.any(String), ...expected });
    expect(answers.team).toMatchObject({ type: "choice", choice: "sales", confidence: 1 });
    expect(outcome).toMatchObject({ answered: 1, usage: { inputTokens: 50, upstreamCalls: 1 } });
  });

  it("answers a choice over 30 options in two stages: P(option) = P(group)·P(option | group)", async () => {
    const options = Array.from({ length: 30 }, (_, i) => `option-${i}`);
    const { outcome, answers, fake } = await decide(
      routeByMarker({
        "Options, in groups": () => logprobsReply({ A: 0.7, B: 0.3 }, { prompt: 400 }),
        "A: option-0\n": () => logprobsReply({ C: 1 }, { prompt: 200 }),
        "A: option-15\n": () => logprobsReply({ A: 0.5, B: 0.5 }, { prompt: 200 }),
      }),
      [{ key: "pick", type: "choice", instructions: "Pick one", options }],
    );
    const probabilities = answers.pick!.probabilities as Record<string, number>;
    expect(Object.keys(probabilities)).toEqual(options);
    expect(probabilities["option-2"]).toBe(0.7);
    expect(probabilities["option-15"]).toBe(0.15);
    expect(probabilities["option-16"]).toBe(0.15);
    expect(answers.pick).toMatchObject({ choice: "option-2", xApprox: false, xLabelMass: 1, xMethod: "logprobs" });
    expect(outcome.usage).toMatchObject({ inputTokens: 800, upstreamCalls: 3 });
    const stage1 = userContent(fake.questionRequests().find((r) => userContent(r).includes("Options, in groups"))!);
    expect(stage1).toContain("Group A:\n- option-0\n- option-1\n");
    expect(stage1).toContain("Group B:\n- option-15\n");
  });

  it("spreads an unexpanded group evenly and flags the answer approximate", async () => {
    const options = Array.from({ length: 27 }, (_, i) => `o${i}`);
    const { answers } = await decide(
      routeByMarker({
        "Options, in groups": () => logprobsReply({ A: 0.6, B: 0.4 }),
        "A: o0\n": () => logprobsReply({ B: 1 }),
        "A: o14\n": () => logprobsReply({ Nothing: 1 }),
      }),
      [{ key: "pick", type: "choice", instructions: "Pick one", options }],
    );
    const probabilities = answers.pick!.probabilities as Record<string, number>;
    expect(probabilities.o1).toBe(0.6);
    expect(probabilities.o14).toBeCloseTo(0.4 / 13, 6);
    expect(answers.pick).toMatchObject({ choice: "o1", xApprox: true });
  });
});

describe("two-stage choice when a group cannot be read", () => {
  const options = Array.from({ length: 60 }, (_, i) => `opt${i}`);
  // 60 options in three groups of 20: A = opt0–19, B = opt20–39, C = opt40–59; the true best is opt45 (0.5).
  const stage1 = () => logprobsReply({ A: 0.3, B: 0.2, C: 0.5 }, { prompt: 400 });
  const groupA = () => logprobsReply({ D: 1 }, { prompt: 200 });
  const groupB = () => logprobsReply({ A: 1 }, { prompt: 200 });

  it("asks the group that could hold the winner once more, and answers from it", async () => {
    const { outcome, answers, fake } = await decide(
      routeByMarker({
        "Options, in groups": stage1,
        "A: opt0\n": groupA,
        "A: opt20\n": groupB,
        // No label in the window twice (the readout's own retry), then an answer on the group's second read.
        "A: opt40\n": (_r, n) => (n <= 2 ? logprobsReply({ Hello: 1 }) : logprobsReply({ F: 1 }, { prompt: 200 })),
      }),
      [{ key: "pick", type: "choice", instructions: "Pick one", options }],
    );
    expect(answers.pick).toMatchObject({ choice: "opt45", xApprox: false });
    expect((answers.pick!.probabilities as Record<string, number>).opt45).toBe(0.5);
    expect(fake.questionRequests().filter((r) => userContent(r).includes("A: opt40\n"))).toHaveLength(3);
    // Billed: the calls that answered (stage 1, groups A and B, group C's third call).
    expect(outcome.usage).toMatchObject({ inputTokens: 1_000, upstreamCalls: 4 });
  });

  it("fails the question (retryable) when that group still cannot be read, instead of naming another winner", async () => {
    const { outcome, answers } = await decide(
      routeByMarker({
        "Options, in groups": stage1,
        "A: opt0\n": groupA,
        "A: opt20\n": groupB,
        "A: opt40\n": () => logprobsReply({ Hello: 1 }),
      }),
      [{ key: "pick", type: "choice", instructions: "Pick one", options }],
    );
    expect(answers.pick).toEqual({ type: "error", code: "no_signal", message: expect.any(String), retryable: true });
    expect(outcome).toMatchObject({ answered: 0, usage: { upstreamCalls: 0 } });
  });
});

describe("a server that caps its logprob window (vLLM --max-logprobs 5)", () => {
  it("asks a 12-option choice in groups of at most 5, each call within the window", async () => {
    const options = Array.from({ length: 12 }, (_, i) => `o${i}`);
    const route = routeByMarker({
      "Options, in groups": () => logprobsReply({ A: 0.1, B: 0.8, C: 0.1 }),
      "A: o0\n": () => logprobsReply({ A: 1 }),
      "A: o4\n": () => logprobsReply({ C: 0.9, D: 0.1 }),
      "A: o8\n": () => logprobsReply({ B: 1 }),
    });
    const { answers, fake } = await decide((request, index) => (Number(request.body.top_logprobs) > 5 ? vllmMaxLogprobs(Number(request.body.top_logprobs), 5) : route(request, index)), [
      { key: "pick", type: "choice", instructions: "Pick one", options },
    ]);
    expect(answers.pick).toMatchObject({ choice: "o6", xApprox: false });
    expect((answers.pick!.probabilities as Record<string, number>).o6).toBe(0.72);
    const asked = fake.questionRequests();
    for (const r of asked) expect(r.body.top_logprobs).toBe(5);
    const listing = userContent(asked.find((r) => userContent(r).includes("Options, in groups"))!);
    expect(listing).toContain("Group A:\n- o0\n- o1\n- o2\n- o3\nGroup B:\n- o4\n");
    expect(listing).toContain("Group C:\n- o8\n- o9\n- o10\n- o11\n\n");
    const inner = userContent(asked.find((r) => userContent(r).includes("A: o4\n"))!);
    expect(inner).toContain("A: o4\nB: o5\nC: o6\nD: o7\n\n");
  });
});

describe("a failing probe", () => {
  it("fails every question, without inventing answers", async () => {
    const { outcome } = await decide(() => ({ status: 401, json: { error: { message: "invalid api key sk-x" } } }), questions);
    expect(outcome.answered).toBe(0);
    expect(outcome.usage).toEqual({ inputTokens: 0, outputTokens: 0, cachedInputTokens: 0, upstreamCalls: 0 });
    for (const [, answer] of outcome.answers) expect(answer).toMatchObject({ type: "error", code: "upstream_error", retryable: false });
  });
});

describe("verbalized fallback", () => {
  const noLogprobs: FakeHandler = (r) =>
    r.body.logprobs ? { status: 400, json: { error: { message: "logprobs are not supported with reasoning models" } } } : textReply('{"yes":1}');

  it("averages option-order permutations of a JSON distribution and marks the method", async () => {
    const { outcome, answers, fake } = await decide(
      (r, index) => {
        if (isProbe(r.body)) return noLogprobs(r, index);
        const text = userContent(r);
        const line = (name: string) => [...text.matchAll(/^([A-Z]): (\w+)$/gm)].find((m) => m[2] === name)![1]!;
        if (text.includes("Which team?")) {
          return textReply(JSON.stringify({ [line("billing")]: 0.2, [line("technical")]: 0.2, [line("sales")]: 0.6 }), { prompt: 90 });
        }
        return textReply('{"yes": 0.8, "no": 0.2}', { prompt: 80 });
      },
      questions.slice(0, 2),
    );
    expect(answers.team).toEqual({
      type: "choice",
      choice: "sales",
      probabilities: { billing: 0.2, technical: 0.2, sales: 0.6 },
      confidence: 0.4,
      xMethod: "verbalized",
      xAgreement: 1,
    });
    expect(answers.urgent).toMatchObject({ type: "noul", noul: 0.8, xMethod: "verbalized" });
    expect(outcome.usage).toMatchObject({ inputTokens: 3 * 90 + 2 * 80, upstreamCalls: 5 });
    const team = fake.questionRequests().filter((r) => userContent(r).includes("Which team?"));
    expect(team.map((r) => userContent(r).match(/^A: (\w+)$/m)![1])).toEqual(["billing", "technical", "sales"]);
    for (const r of team) {
      expect(r.body.logprobs).toBeUndefined();
      expect(r.body.response_format?.json_schema?.schema?.required).toEqual(["A", "B", "C"]);
    }
  });

  it("reports a choice over more than 26 options as unsupported, and answers the rest", async () => {
    const options = Array.from({ length: 27 }, (_, i) => `o${i}`);
    const { answers, fake } = await decide(
      (r, index) => (isProbe(r.body) ? noLogprobs(r, index) : textReply('{"yes": 0.5, "no": 0.5}')),
      [{ key: "pick", type: "choice", instructions: "Pick one", options }, questions[0]!],
    );
    expect(answers.pick).toMatchObject({ type: "error", code: "unsupported", retryable: false });
    expect(answers.urgent).toMatchObject({ type: "noul", noul: 0.5, xMethod: "verbalized", xAgreement: 1 });
    expect(fake.questionRequests().every((r) => !userContent(r).includes("Pick one"))).toBe(true);
  });

  it("asks again with feedback after a reply that is not the JSON, without billing it", async () => {
    const { outcome, answers, fake } = await decide(
      (r, index) => {
        if (isProbe(r.body)) return noLogprobs(r, index);
        const feedback = r.body.messages.length > 2;
        return feedback ? textReply('{"yes": 0.3, "no": 0.7}', { prompt: 150 }) : textReply("Probably yes.", { prompt: 80 });
      },
      [questions[0]!],
    );
    expect(answers.urgent).toMatchObject({ type: "noul", noul: 0.3, xMethod: "verbalized" });
    expect(outcome.usage).toMatchObject({ inputTokens: 300, upstreamCalls: 2 });
    const retry = fake.questionRequests().find((r) => r.body.messages.length > 2)!;
    expect(retry.body.messages.slice(2).map((m) => m.role)).toEqual(["assistant", "user"]);
  });
});
