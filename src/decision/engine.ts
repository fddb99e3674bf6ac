import { setMaxListeners } from "node:events";
import type { Logger } from "../logger.js";
import { linkedSignal } from "../abort-signals.js";
import { LlmCallError, type CallOptions, type ChatMessage, type ChatUsage } from "../upstream/model-call.js";
import {
  averageDistributions,
  choiceAnswer,
  combineTwoStage,
  errorAnswer,
  groupsToExpand,
  noulAnswer,
  scoreAnswer,
  type AnswerInit,
  type LabelDistribution,
} from "./answer-math.js";
import { NoSignal, Refused, type DistributionReader, type LabelReader, type LabelScorer, type Readout, type VerbalizedReader } from "./label-scorer.js";
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
  type LabelLine,
  type QuestionBlock,
} from "./prompt.js";

/**
 * The decision engine: one read per question (two stages for a choice over
 * more than 26 options), all questions of a request in parallel over one
 * byte-identical prefix, answers read through a label scorer
 * (label-scorer.ts: the upstream's or the embedded model's). Failures stay
 * with their question; the engine never invents a number for a question it
 * could not answer.
 */

/** The contract lets a question use this many input tokens; it is also what is reserved for one. */
export const QUESTION_BUDGET_TOKENS = 32_000;
/** Option-order permutations averaged on the verbalized path. */
const VERBALIZED_SAMPLES = 3;

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

interface QuestionResult {
  answer: AnswerInit;
  /** Usage of the calls whose output went into the answer. */
  billed: ChatUsage[];
}

/** What every read of one request shares: the prefix and the reader (which holds the request's signal and deadline). */
interface Asker {
  stateBlock: string;
  reader: DistributionReader;
  /** Labels one read can tell apart: 26 letters, or fewer when the server caps its logprob window. */
  labelsPerCall: number;
}

/** The engine over one label scorer; it keeps no state between requests (the upstream's client caches its probe). */
export function createDecisionEngine(deps: { scorer: LabelScorer; logger: Logger }): DecisionEngine {
  const { scorer, logger } = deps;

  async function decide(input: { stateBlock: string; questions: readonly QuestionSpec[] }, options: CallOptions): Promise<DecideOutcome> {
    // Every read of the request listens on one signal: up to 40 questions × (call, retry wait, semaphore).
    const request = linkedSignal([options.signal]);
    setMaxListeners(0, request.signal);
    let reader: LabelReader;
    try {
      // This request is one party of the fair share of upstream slots, unless the caller names one (the evaluation runner: all its examples are one).
      reader = await scorer.begin(input.stateBlock, { signal: request.signal, deadlineMs: options.deadlineMs, party: options.party ?? {} });
    } catch (err) {
      request.dispose();
      const failed = failureAnswer(err);
      return { answers: input.questions.map((q) => [q.key, failed]), usage: sumUsage([]), answered: 0 };
    }
    const answer = answering(input.stateBlock, reader);
    const results = await Promise.all(
      input.questions.map(async (q): Promise<QuestionResult> => {
        try {
          return await answer(q);
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

  /** How a question is answered with this reader: from the distribution it reads, or from distributions the model states. */
  function answering(stateBlock: string, reader: LabelReader): (q: QuestionSpec) => Promise<QuestionResult> {
    if (reader.kind === "verbalized") return (q) => answerVerbalized(q, stateBlock, reader);
    const ask: Asker = { stateBlock, reader, labelsPerCall: Math.min(MAX_LABELS_PER_CALL, reader.labelsPerRead) };
    return (q) => answerWithLogprobs(q, ask);
  }

  async function answerWithLogprobs(q: QuestionSpec, ask: Asker): Promise<QuestionResult> {
    switch (q.type) {
      case "noul": {
        const r = await ask.reader.read(noulBlock(q.instructions), NOUL_LABELS);
        return { answer: noulAnswer(r.distribution.probabilities, logprobExtras(r.distribution)), billed: [r.usage] };
      }
      case "score": {
        const labels = scoreLabels(q.labels.length);
        const r = await ask.reader.read(scoreBlock(q.instructions, lines(labels, q.labels)), labels);
        return { answer: scoreAnswer(q.labels, r.distribution.probabilities, logprobExtras(r.distribution)), billed: [r.usage] };
      }
      case "choice": {
        if (q.options.length > ask.labelsPerCall) return twoStageChoice(q.instructions, q.options, ask);
        const labels = letterLabels(q.options.length);
        const r = await ask.reader.read(choiceBlock(q.instructions, lines(labels, q.options)), labels);
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
    const stage1 = await ask.reader.read(groupBlock(instructions, groupListing(options, ask.labelsPerCall)), letterLabels(groups.length));
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
        return { group: p.group, readout: await ask.reader.read(p.block, p.labels) };
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
  async function answerVerbalized(q: QuestionSpec, stateBlock: string, reader: VerbalizedReader): Promise<QuestionResult> {
    const plan = verbalizedPlan(q);
    if (!plan) return { answer: errorAnswer("unsupported", false), billed: [] };
    const perSample = estimateTokens(buildMessages(stateBlock, verbalizedBlock(q.instructions, plan.samples[0]!.lines, plan.heading).text));
    const samples = plan.samples.slice(0, Math.max(1, Math.floor(QUESTION_BUDGET_TOKENS / perSample)));
    const settled = await Promise.allSettled(
      samples.map(async (sample) => {
        const { probabilities: stated, usage } = await reader.state(verbalizedBlock(q.instructions, sample.lines, plan.heading), plan.symbols);
        const probabilities = new Array<number>(stated.length).fill(0);
        stated.forEach((p, i) => (probabilities[sample.canonical(i)] = p));
        return { probabilities, usage };
      }),
    );
    const ok = settled.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
    if (ok.length === 0) throw (settled[0] as PromiseRejectedResult).reason;
    const { probabilities, agreement } = averageDistributions(ok.map((s) => s.probabilities));
    const extras = { method: "verbalized" as const, agreement };
    return { answer: verbalizedAnswer(q, probabilities, extras), billed: ok.map((s) => s.usage) };
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

function logprobExtras(d: LabelDistribution) {
  return { method: "logprobs" as const, mass: d.mass, unseen: d.unseen, unseenMassMax: d.unseenMassMax };
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
