import crypto from "node:crypto";
import { setMaxListeners } from "node:events";
import type { Logger } from "../logger.js";
import { linkedSignal } from "../abort-signals.js";
import {
  LlmCallError,
  type CallOptions,
  type ChatCompletion,
  type ChatMessage,
  type ChatUsage,
  type LlmCapabilities,
  type LlmClient,
} from "../upstream/llm-client.js";
import { isReasoningOpener, mostProbable } from "../upstream/logprob-window.js";
import {
  averageDistributions,
  choiceAnswer,
  combineTwoStage,
  errorAnswer,
  groupsToExpand,
  firstPositionWindow,
  noulAnswer,
  readLabelDistribution,
  scoreAnswer,
  type AnswerInit,
  type LabelDistribution,
} from "./answer-math.js";
import { letterLabels, MAX_LABELS_PER_CALL, NOUL_LABELS, scoreLabels, splitIntoGroups, type LabelSet } from "./labels.js";
import { unknownQuestionType } from "./validate.js";
import {
  buildMessages,
  choiceBlock,
  estimateTokens,
  groupBlock,
  noulBlock,
  scoreBlock,
  verbalizedBlock,
  VERBALIZED_FEEDBACK,
  type LabelLine,
  type QuestionBlock,
} from "./prompt.js";

/**
 * The decision engine: one upstream call per question (two stages for a
 * choice over more than 26 options), all questions of a request in parallel
 * over one byte-identical prefix, answers read from the next-token
 * distribution. Failures stay with their question; the engine never
 * invents a number for a question it could not answer.
 */

/** The contract lets a question use this many input tokens; it is also what is reserved for one. */
export const QUESTION_BUDGET_TOKENS = 32_000;
/** Option-order permutations averaged on the verbalized path. */
const VERBALIZED_SAMPLES = 3;
/** Retries with feedback after a verbalized reply that is not the JSON asked for (not billed). */
const VERBALIZED_FORMAT_RETRIES = 2;

export type QuestionSpec =
  | { key: string; type: "noul"; instructions: string }
  | { key: string; type: "choice"; instructions: string; options: string[] }
  | { key: string; type: "score"; instructions: string; labels: string[] };

export interface UsageTotals {
  inputTokens: number;
  outputTokens: number;
  cachedInputTokens: number;
  upstreamCalls: number;
}

export interface DecideOutcome {
  /** Answers in question order. */
  answers: Array<[string, AnswerInit]>;
  /** Usage of the calls that produced answers. */
  usage: UsageTotals;
  /** Questions answered (not errors). */
  answered: number;
}

export interface DecisionEngine {
  decide(input: { stateBlock: string; questions: readonly QuestionSpec[] }, options: CallOptions): Promise<DecideOutcome>;
}

/** The messages of a question's first call, for the size check before any money moves. */
export function firstCallMessages(stateBlock: string, question: QuestionSpec): ChatMessage[] {
  return buildMessages(stateBlock, firstBlock(question).text);
}

function firstBlock(q: QuestionSpec): QuestionBlock {
  switch (q.type) {
    case "noul":
      return noulBlock(q.instructions);
    case "score":
      return scoreBlock(q.instructions, lines(scoreLabels(q.labels.length), q.labels));
    case "choice":
      if (q.options.length <= MAX_LABELS_PER_CALL) return choiceBlock(q.instructions, lines(letterLabels(q.options.length), q.options));
      return groupBlock(q.instructions, groupListing(q.options));
  }
}

function lines(labels: LabelSet, texts: readonly string[]): LabelLine[] {
  return texts.map((text, i) => ({ symbol: labels.symbols[i]!, text }));
}

function groupListing(options: readonly string[], perGroup = MAX_LABELS_PER_CALL) {
  const groups = splitIntoGroups(options.length, perGroup);
  const symbols = letterLabels(groups.length).symbols;
  return groups.map((members, g) => ({ symbol: symbols[g]!, names: members.map((i) => options[i]!) }));
}

class NoSignal extends Error {
  constructor() {
    super("no label in the window");
    this.name = "NoSignal";
  }
}

class Refused extends Error {
  constructor() {
    super("the model refused");
    this.name = "Refused";
  }
}

interface Readout {
  distribution: LabelDistribution;
  usage: ChatUsage;
}

interface QuestionResult {
  answer: AnswerInit;
  /** Usage of the calls whose output went into the answer. */
  billed: ChatUsage[];
}

/** What every call of one request shares: the prefix, the cache key and the request's signal and deadline. */
interface Asker {
  stateBlock: string;
  cacheKey: string;
  options: CallOptions;
  /** Labels one call can read: 26 letters, or fewer when the server caps its logprob window. */
  labelsPerCall: number;
}

/** The engine over one LLM client; it keeps no state between requests (the client caches the probe). */
export function createDecisionEngine(deps: { llm: LlmClient; logger: Logger }): DecisionEngine {
  const { llm, logger } = deps;

  async function decide(input: { stateBlock: string; questions: readonly QuestionSpec[] }, options: CallOptions): Promise<DecideOutcome> {
    let caps: LlmCapabilities;
    try {
      caps = await llm.capabilities(options);
    } catch (err) {
      const failed = failureAnswer(err);
      return { answers: input.questions.map((q) => [q.key, failed]), usage: sumUsage([]), answered: 0 };
    }
    const cacheKey = crypto.createHash("sha256").update(input.stateBlock).digest("hex").slice(0, 32);
    // Every call of the request listens on one signal: up to 40 questions × (call, retry wait, semaphore).
    const request = linkedSignal([options.signal]);
    setMaxListeners(0, request.signal);
    const ask: Asker = {
      stateBlock: input.stateBlock,
      cacheKey,
      // This request is one party of the fair share of upstream slots, unless the caller names one (the evaluation runner: all its examples are one).
      options: { signal: request.signal, deadlineMs: options.deadlineMs, party: options.party ?? {} },
      labelsPerCall: Math.min(MAX_LABELS_PER_CALL, caps.topLogprobs),
    };
    const results = await Promise.all(
      input.questions.map(async (q): Promise<QuestionResult> => {
        try {
          return caps.logprobs ? await answerWithLogprobs(q, ask) : await answerVerbalized(q, ask);
        } catch (err) {
          return { answer: failureAnswer(err), billed: [] };
        }
      }),
    );
    request.dispose();
    return {
      answers: input.questions.map((q, i) => [q.key, results[i]!.answer]),
      usage: sumUsage(results.flatMap((r) => r.billed)),
      answered: results.filter((r) => r.answer.type !== "error").length,
    };
  }

  /** One logprobs call, read over `labels`; once more with the closing line repeated if no label came back. */
  async function readout(ask: Asker, block: QuestionBlock, labels: LabelSet): Promise<Readout> {
    const first = buildMessages(ask.stateBlock, block.text);
    if (llm.scoreLabels) return exactReadout(llm.scoreLabels.bind(llm), first, labels, ask);
    const again = buildMessages(ask.stateBlock, `${block.text}\n${block.closing}`);
    for (const messages of [first, again]) {
      const completion = await llm.complete({ kind: "logprobs", messages, cacheKey: ask.cacheKey }, ask.options);
      if (completion.refused) throw new Refused();
      const window = firstPositionWindow(completion.topLogprobs, completion.firstToken);
      if (isReasoningOpener(mostProbable(window)?.token)) continue;
      const distribution = readLabelDistribution(window, labels, completion.topLogprobs ?? []);
      if (distribution.mass > 0) return { distribution, usage: usageOf(completion, messages) };
    }
    throw new NoSignal();
  }

  /** The whole distribution: every label's probability exact, so none is unseen and the mass is the true one. */
  async function exactReadout(score: NonNullable<LlmClient["scoreLabels"]>, messages: ChatMessage[], labels: LabelSet, ask: Asker): Promise<Readout> {
    const scored = await score({ messages, spellings: labels.spellings }, ask.options);
    const mass = scored.probabilities.reduce((a, b) => a + b, 0);
    if (!(mass > 0)) throw new NoSignal();
    return {
      distribution: { probabilities: scored.probabilities.map((p) => p / mass), mass: Math.min(mass, 1), unseen: 0, unseenMassMax: 0 },
      usage: scored.usage,
    };
  }

  async function answerWithLogprobs(q: QuestionSpec, ask: Asker): Promise<QuestionResult> {
    switch (q.type) {
      case "noul": {
        const r = await readout(ask, noulBlock(q.instructions), NOUL_LABELS);
        return { answer: noulAnswer(r.distribution.probabilities, logprobExtras(r.distribution)), billed: [r.usage] };
      }
      case "score": {
        const labels = scoreLabels(q.labels.length);
        const r = await readout(ask, scoreBlock(q.instructions, lines(labels, q.labels)), labels);
        return { answer: scoreAnswer(q.labels, r.distribution.probabilities, logprobExtras(r.distribution)), billed: [r.usage] };
      }
      case "choice": {
        if (q.options.length > ask.labelsPerCall) return twoStageChoice(q.instructions, q.options, ask);
        const labels = letterLabels(q.options.length);
        const r = await readout(ask, choiceBlock(q.instructions, lines(labels, q.options)), labels);
        return { answer: choiceAnswer(q.options, r.distribution.probabilities, logprobExtras(r.distribution)), billed: [r.usage] };
      }
    }
  }

  /**
   * More options than one call can read (26, or the server's logprob cap):
   * ask for the group letter, then within the likely groups (at most 3,
   * covering 99 % of the mass, within the question's token budget);
   * P(option) = P(group) · P(option | group). A group whose call failed is
   * asked once more when it could hold the winner, and the question fails
   * (retryable) if it still cannot be read: never a silently different choice.
   */
  async function twoStageChoice(instructions: string, options: readonly string[], ask: Asker): Promise<QuestionResult> {
    const groups = splitIntoGroups(options.length, ask.labelsPerCall);
    const stage1 = await readout(ask, groupBlock(instructions, groupListing(options, ask.labelsPerCall)), letterLabels(groups.length));
    const groupProbabilities = stage1.distribution.probabilities;
    let budget = QUESTION_BUDGET_TOKENS - stage1.usage.promptTokens;
    const planned: Array<{ group: number; block: QuestionBlock; labels: LabelSet }> = [];
    for (const group of groupsToExpand(groupProbabilities)) {
      const members = groups[group]!;
      const labels = letterLabels(members.length);
      const block = choiceBlock(instructions, lines(labels, members.map((i) => options[i]!)));
      const cost = estimateTokens(buildMessages(ask.stateBlock, block.text));
      if (cost > budget) continue;
      budget -= cost;
      planned.push({ group, block, labels });
    }
    type GroupRead = { group: number; readout: Readout } | { group: number; error: unknown };
    const readGroup = async (p: (typeof planned)[number]): Promise<GroupRead> => {
      try {
        return { group: p.group, readout: await readout(ask, p.block, p.labels) };
      } catch (err) {
        if (err instanceof LlmCallError && err.code === "aborted") throw err;
        return { group: p.group, error: err };
      }
    };
    const inner = await Promise.all(planned.map(readGroup));
    const within = new Map<number, number[]>();
    const billed = [stage1.usage];
    const take = (result: GroupRead) => {
      if (!("readout" in result)) return false;
      within.set(result.group, result.readout.distribution.probabilities);
      billed.push(result.readout.usage);
      return true;
    };
    const failed = inner.filter((result) => !take(result));
    if (failed.length > 0) {
      // What the others say without the failed groups: a failed group matters when its whole mass could beat their best.
      const known = combineTwoStage(groups, groupProbabilities, within, options.length).probabilities;
      for (const { group } of failed) {
        const others = Math.max(0, ...known.filter((_p, option) => !groups[group]!.includes(option)));
        if (groupProbabilities[group]! < others) {
          logger.debug("two-stage choice: a group could not be read and cannot hold the winner; spread evenly", { group });
          continue;
        }
        const again = await readGroup(planned.find((p) => p.group === group)!);
        if ("error" in again) throw again.error;
        take(again);
      }
    }
    const combined = combineTwoStage(groups, groupProbabilities, within, options.length);
    const answer = choiceAnswer(options, combined.probabilities, {
      method: "logprobs",
      mass: stage1.distribution.mass,
      unseen: combined.probabilities.filter((p) => p === 0).length,
      approx: combined.approx,
    });
    return { answer, billed };
  }

  /**
   * No usable logprobs: the model states a JSON distribution over the labels,
   * once per option-order permutation (as many as the 32K budget allows), and
   * the un-permuted distributions are averaged.
   */
  async function answerVerbalized(q: QuestionSpec, ask: Asker): Promise<QuestionResult> {
    const plan = verbalizedPlan(q);
    if (!plan) return { answer: errorAnswer("unsupported", false), billed: [] };
    const perSample = estimateTokens(buildMessages(ask.stateBlock, verbalizedBlock(q.instructions, plan.samples[0]!.lines, plan.heading).text));
    const samples = plan.samples.slice(0, Math.max(1, Math.floor(QUESTION_BUDGET_TOKENS / perSample)));
    const settled = await Promise.allSettled(
      samples.map((sample) => verbalizedSample(ask, verbalizedBlock(q.instructions, sample.lines, plan.heading), plan.symbols, sample.canonical)),
    );
    const ok = settled.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
    if (ok.length === 0) throw (settled[0] as PromiseRejectedResult).reason;
    const { probabilities, agreement } = averageDistributions(ok.map((s) => s.probabilities));
    const extras = { method: "verbalized" as const, agreement };
    return { answer: verbalizedAnswer(q, probabilities, extras), billed: ok.map((s) => s.usage) };
  }

  async function verbalizedSample(
    ask: Asker,
    block: QuestionBlock,
    symbols: readonly string[],
    canonical: (symbolIndex: number) => number,
  ): Promise<{ probabilities: number[]; usage: ChatUsage }> {
    const schema = {
      type: "object",
      properties: Object.fromEntries(symbols.map((s) => [s, { type: "number" }])),
      required: [...symbols],
      additionalProperties: false,
    };
    let messages = buildMessages(ask.stateBlock, block.text);
    for (let attempt = 0; attempt <= VERBALIZED_FORMAT_RETRIES; attempt++) {
      const completion = await llm.complete(
        { kind: "json", messages, schema, maxTokens: 16 + 12 * symbols.length, cacheKey: ask.cacheKey },
        ask.options,
      );
      if (completion.refused) throw new Refused();
      const stated = parseVerbalized(completion.content, symbols);
      if (stated) {
        const probabilities = new Array<number>(symbols.length).fill(0);
        stated.forEach((p, i) => (probabilities[canonical(i)] = p));
        return { probabilities, usage: usageOf(completion, messages) };
      }
      messages = [...messages, { role: "assistant", content: completion.content.slice(0, 2_000) }, { role: "user", content: VERBALIZED_FEEDBACK }];
    }
    throw new NoSignal();
  }

  function failureAnswer(err: unknown): AnswerInit {
    if (err instanceof NoSignal) return errorAnswer("no_signal", true);
    if (err instanceof Refused) return errorAnswer("refusal", false);
    if (err instanceof LlmCallError) {
      if (err.code === "timeout" || err.code === "aborted") return errorAnswer("timeout", true);
      return errorAnswer("upstream_error", err.retryable);
    }
    logger.error("decision question failed unexpectedly", { err: err instanceof Error ? err : String(err) });
    return errorAnswer("upstream_error", false);
  }

  return { decide };
}

interface VerbalizedPlan {
  heading: string;
  /** Symbols in label order (the JSON keys asked for). */
  symbols: string[];
  /** Per permutation: the lines in listing order, and symbol index → label index. */
  samples: Array<{ lines: LabelLine[]; canonical: (symbolIndex: number) => number }>;
}

/**
 * The permutations of the verbalized path. choice: the letters stay A, B, …
 * but the option behind each letter rotates; noul and score: the symbols keep
 * their meaning and the listing order is reversed on the second sample.
 */
function verbalizedPlan(q: QuestionSpec): VerbalizedPlan | undefined {
  const identity = (i: number) => i;
  if (q.type === "choice") {
    const n = q.options.length;
    if (n > MAX_LABELS_PER_CALL) return undefined;
    const symbols = letterLabels(n).symbols;
    const k = Math.min(VERBALIZED_SAMPLES, n);
    return {
      heading: "Options",
      symbols,
      samples: Array.from({ length: k }, (_, j) => {
        const offset = Math.floor((j * n) / k);
        const canonical = (i: number) => (i + offset) % n;
        return { lines: symbols.map((symbol, i) => ({ symbol, text: q.options[canonical(i)]! })), canonical };
      }),
    };
  }
  const symbols = q.type === "noul" ? NOUL_LABELS.symbols : scoreLabels(q.labels.length).symbols;
  const texts = q.type === "noul" ? ["yes", "no"] : q.labels;
  const forward = symbols.map((symbol, i) => ({ symbol, text: texts[i]! }));
  const heading =
    q.type === "noul" ? "Labels" : `Scale, ordered from ${symbols[0]} (lowest) to ${symbols.at(-1)} (highest)`;
  return {
    heading,
    symbols,
    samples: [
      { lines: forward, canonical: identity },
      { lines: [...forward].reverse(), canonical: identity },
    ],
  };
}

/**
 * A stated distribution: a JSON object (possibly inside other text) with a
 * non-negative number for every symbol, normalized; undefined otherwise.
 */
export function parseVerbalized(content: string, symbols: readonly string[]): number[] | undefined {
  const text = withoutReasoning(content).trim();
  const start = text.indexOf("{");
  const end = text.lastIndexOf("}");
  if (start < 0 || end <= start) return undefined;
  let json: unknown;
  try {
    json = JSON.parse(text.slice(start, end + 1));
  } catch {
    return undefined;
  }
  if (typeof json !== "object" || json === null || Array.isArray(json)) return undefined;
  const entries = new Map(Object.entries(json).map(([k, v]) => [k.trim().toLowerCase(), v]));
  const values: number[] = [];
  for (const symbol of symbols) {
    const value: unknown = (json as Record<string, unknown>)[symbol] ?? entries.get(symbol.toLowerCase());
    if (typeof value !== "number" || !Number.isFinite(value) || value < 0) return undefined;
    values.push(value);
  }
  const sum = values.reduce((a, b) => a + b, 0);
  if (!(sum > 0)) return undefined;
  return values.map((v) => v / sum);
}

/**
 * The answer part of a reply from a model that reasons in its content: what
 * follows the last `</think>` (DeepSeek-R1, Qwen3 without a reasoning parser)
 * or the final channel of gpt-oss's harmony format; nothing when the
 * reasoning never closed (the budget ran out).
 */
export function withoutReasoning(content: string): string {
  const closed = content.toLowerCase().lastIndexOf(THINK_CLOSE);
  if (closed >= 0) return content.slice(closed + THINK_CLOSE.length);
  const final = content.lastIndexOf(HARMONY_FINAL);
  if (final >= 0) return content.slice(final + HARMONY_FINAL.length);
  return /^\s*(<think>|<\|channel\|>)/i.test(content) ? "" : content;
}
const THINK_CLOSE = "</think>";
const HARMONY_FINAL = "<|channel|>final<|message|>";

function logprobExtras(d: LabelDistribution) {
  return { method: "logprobs" as const, mass: d.mass, unseen: d.unseen, unseenMassMax: d.unseenMassMax };
}

/** The usage a call reported, or an estimate from its prompt when it reported none. */
function usageOf(completion: ChatCompletion, messages: readonly ChatMessage[]): ChatUsage {
  return completion.usage ?? { promptTokens: estimateTokens(messages), cachedTokens: 0, completionTokens: 1 };
}

function sumUsage(calls: readonly ChatUsage[]): UsageTotals {
  return {
    inputTokens: calls.reduce((sum, u) => sum + u.promptTokens, 0),
    outputTokens: calls.reduce((sum, u) => sum + u.completionTokens, 0),
    cachedInputTokens: calls.reduce((sum, u) => sum + u.cachedTokens, 0),
    upstreamCalls: calls.length,
  };
}

/** A verbalized distribution as the answer of its question's type. */
function verbalizedAnswer(q: QuestionSpec, probabilities: readonly number[], extras: { method: "verbalized"; agreement: number }): AnswerInit {
  switch (q.type) {
    case "noul":
      return noulAnswer(probabilities, extras);
    case "choice":
      return choiceAnswer(q.options, probabilities, extras);
    case "score":
      return scoreAnswer(q.labels, probabilities, extras);
    default:
      return unknownQuestionType(q);
  }
}
