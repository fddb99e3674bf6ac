import type { MessageInitShape } from "@bufbuild/protobuf";
import type { AnswerSchema } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import type { TokenLogprob } from "../upstream/logprob-window.js";
import type { LabelSet } from "./labels.js";

/**
 * The numbers of an answer: a next-token window turned into a distribution
 * over labels, and the answer of each type built from it (only its own fields).
 * Pure functions; the engine supplies the windows.
 */

export type AnswerInit = MessageInitShape<typeof AnswerSchema>;
export type Method = "logprobs" | "verbalized";

export interface LabelDistribution {
  /** Renormalized over the labels, in label order; all zeros when `mass` is 0. */
  probabilities: number[];
  /** The share of next-token probability that fell on the labels. */
  mass: number;
  /** Labels absent from the window. */
  unseen: number;
  /** The most the unseen labels can hold together: `mass` is a lower bound, `mass + unseenMassMax` an upper one. */
  unseenMassMax: number;
}

/** vLLM clamps -inf to -9999 so JSON can carry it: such entries are probability 0. */
const NEGLIGIBLE_LOGPROB = -9999;

/**
 * Sums the probability of every entry of each label (`A` and ` A` are
 * disjoint outcomes with the same meaning; so are two entries that decode to
 * the same string, as `▁A` and `A` do on some vLLM and SGLang versions,
 * vllm#44319, sglang#32290), then renormalizes over the labels. `window` is
 * the top-logprobs list (see firstPositionWindow for the sampled token).
 */
export function readLabelDistribution(
  window: readonly TokenLogprob[],
  labels: LabelSet,
  topLogprobs: readonly TokenLogprob[] = window,
): LabelDistribution {
  const sums = new Array<number>(labels.symbols.length).fill(0);
  for (const entry of window) {
    const index = labels.indexOf(entry.token);
    if (index !== undefined) sums[index]! += probabilityOf(entry);
  }
  const mass = sums.reduce((a, b) => a + b, 0);
  const unseen = sums.filter((s) => s === 0).length;
  return {
    probabilities: mass > 0 ? sums.map((s) => s / mass) : sums,
    mass: Math.min(mass, 1),
    unseen,
    unseenMassMax: unseenMassBound(window, topLogprobs, unseen),
  };
}

function probabilityOf({ logprob }: TokenLogprob): number {
  return Number.isFinite(logprob) && logprob > NEGLIGIBLE_LOGPROB ? Math.exp(Math.min(logprob, 0)) : 0;
}

/**
 * What `unseen` labels can hold together: each at most the smallest entry of
 * the top-logprobs list (it is the top k; 0 when the server listed
 * zero-probability entries, so it listed everything), and all of them at most
 * what the window leaves of 1. The appended sampled token is not in the list:
 * it may lie below the k-th.
 */
export function unseenMassBound(window: readonly TokenLogprob[], topLogprobs: readonly TokenLogprob[], unseen: number): number {
  if (unseen === 0) return 0;
  // Infinity for an empty list: then only what the window leaves bounds them.
  const floor = Math.min(...topLogprobs.map(probabilityOf));
  const left = Math.max(0, 1 - window.reduce((sum, entry) => sum + probabilityOf(entry), 0));
  return Math.min(unseen * floor, left);
}

/**
 * The first position's window: the top logprobs, plus the sampled token only
 * when the list does not already hold it (the one entry that may repeat).
 */
export function firstPositionWindow(topLogprobs: readonly TokenLogprob[] | undefined, sampled: TokenLogprob | undefined): TokenLogprob[] {
  const window = [...(topLogprobs ?? [])];
  if (sampled && !window.some((t) => t.token === sampled.token)) window.push(sampled);
  return window;
}

/** Rounds to 6 decimals: the digits beyond carry only upstream noise. */
export function round6(x: number): number {
  return Math.round(x * 1e6) / 1e6;
}

/** The index of the largest probability; the first one on a tie. */
export function argmax(probabilities: readonly number[]): number {
  let best = 0;
  for (let i = 1; i < probabilities.length; i++) if (probabilities[i]! > probabilities[best]!) best = i;
  return best;
}

/** A choice's confidence, clip((k·max − 1)/(k − 1), 0, 1): 0 when the k options are equally likely, 1 when one holds all the mass. */
export function choiceConfidence(probabilities: readonly number[]): number {
  const k = probabilities.length;
  if (k < 2) return 1;
  const max = Math.max(...probabilities);
  return Math.min(1, Math.max(0, (k * max - 1) / (k - 1)));
}

/**
 * A score's confidence: 1 minus the expected
 * distance from the argmax level, relative to the mean distance of the
 * levels from the middle of the scale; 0 for a split between distant levels.
 */
export function scoreConfidence(probabilities: readonly number[]): number {
  const n = probabilities.length;
  const m = argmax(probabilities);
  const dist = probabilities.reduce((sum, p, i) => sum + p * Math.abs(i - m), 0);
  const mid = (n - 1) / 2;
  const mad = probabilities.reduce((sum, _p, i) => sum + Math.abs(i - mid), 0) / n;
  return mad > 0 ? Math.max(0, 1 - dist / mad) : 1;
}

/** The expected 0-based level. */
export function expectedLevel(probabilities: readonly number[]): number {
  return probabilities.reduce((sum, p, i) => sum + i * p, 0);
}

export interface ReadoutExtras {
  method: Method;
  /** Logprobs only. */
  mass?: number;
  unseen?: number;
  unseenMassMax?: number;
  /** Verbalized only. */
  agreement?: number;
  /** Two-stage choice only. */
  approx?: boolean;
}

interface ExtraFields {
  xLabelMass?: number;
  xMethod: Method;
  xUnseen?: number;
  xUnseenMassMax?: number;
  xAgreement?: number;
  xApprox?: boolean;
}

function extras(x: ReadoutExtras): ExtraFields {
  return {
    ...(x.mass !== undefined ? { xLabelMass: round6(x.mass) } : {}),
    xMethod: x.method,
    ...(x.unseen ? { xUnseen: x.unseen, ...(x.unseenMassMax !== undefined ? { xUnseenMassMax: round6(x.unseenMassMax) } : {}) } : {}),
    ...(x.agreement !== undefined ? { xAgreement: round6(x.agreement) } : {}),
    ...(x.approx !== undefined ? { xApprox: x.approx } : {}),
  };
}

/** `{"type":"noul","noul":P(yes)}`; probabilities in the order yes, no. */
export function noulAnswer(probabilities: readonly number[], x: ReadoutExtras): AnswerInit {
  return { type: "noul", noul: round6(probabilities[0]!), ...extras(x) };
}

/** `{"type":"choice","choice":name,"probabilities":{name:p},"confidence":c}`, names in option order. */
export function choiceAnswer(names: readonly string[], probabilities: readonly number[], x: ReadoutExtras): AnswerInit {
  const byName: Record<string, number> = {};
  names.forEach((name, i) => (byName[name] = round6(probabilities[i]!)));
  return {
    type: "choice",
    choice: names[argmax(probabilities)]!,
    probabilities: byName,
    confidence: round6(choiceConfidence(probabilities)),
    ...extras(x),
  };
}

/** `{"type":"score","score":E[level],"legend":{"0":label},"probabilities":{"0":p},"confidence":c}` plus the argmax. */
export function scoreAnswer(labels: readonly string[], probabilities: readonly number[], x: ReadoutExtras): AnswerInit {
  const legend: Record<string, string> = {};
  const byLevel: Record<string, number> = {};
  labels.forEach((label, i) => {
    legend[String(i)] = label;
    byLevel[String(i)] = round6(probabilities[i]!);
  });
  const index = argmax(probabilities);
  return {
    type: "score",
    score: round6(expectedLevel(probabilities)),
    legend,
    probabilities: byLevel,
    confidence: round6(scoreConfidence(probabilities)),
    xLabel: labels[index]!,
    xIndex: index,
    ...extras(x),
  };
}

export type ErrorCode = "no_signal" | "upstream_error" | "timeout" | "refusal" | "unsupported";

const ERROR_MESSAGES: Record<ErrorCode, string> = {
  no_signal: "no answer label appeared in the upstream model's next-token distribution",
  upstream_error: "the upstream model failed to answer this question",
  timeout: "the upstream model did not answer within the deadline",
  refusal: "the upstream model refused to answer this question",
  unsupported: "the upstream model cannot answer this kind of question",
};

/** A question that could not be answered; the message is fixed text, never upstream output. */
export function errorAnswer(code: ErrorCode, retryable: boolean): AnswerInit {
  return { type: "error", code, message: ERROR_MESSAGES[code], retryable };
}

/**
 * Which groups of a two-stage choice to ask within: the most probable first,
 * until `coverage` of the mass is covered or `maxGroups` are taken. Groups
 * with zero probability are never expanded.
 */
export function groupsToExpand(groupProbabilities: readonly number[], maxGroups = 3, coverage = 0.99): number[] {
  const order = groupProbabilities.map((p, g) => ({ p, g })).sort((a, b) => b.p - a.p || a.g - b.g);
  const chosen: number[] = [];
  let covered = 0;
  for (const { p, g } of order) {
    if (chosen.length >= maxGroups || covered >= coverage || p <= 0) break;
    chosen.push(g);
    covered += p;
  }
  return chosen;
}

/**
 * P(option) = P(group) · P(option | group). A group not asked within (or
 * whose inner call failed) spreads its probability evenly over its options,
 * which makes the answer approximate.
 */
export function combineTwoStage(
  groups: readonly (readonly number[])[],
  groupProbabilities: readonly number[],
  within: ReadonlyMap<number, readonly number[]>,
  optionCount: number,
): { probabilities: number[]; approx: boolean } {
  const probabilities = new Array<number>(optionCount).fill(0);
  let approx = false;
  groups.forEach((members, g) => {
    const pg = groupProbabilities[g]!;
    const inner = within.get(g);
    if (!inner && pg > 0) approx = true;
    members.forEach((option, i) => {
      probabilities[option] = pg * (inner ? inner[i]! : 1 / members.length);
    });
  });
  return { probabilities, approx };
}

/** The mean of several distributions over the same labels, and how far the furthest one strays. */
export function averageDistributions(samples: readonly (readonly number[])[]): { probabilities: number[]; agreement: number } {
  const n = samples[0]!.length;
  const mean = Array.from({ length: n }, (_, i) => samples.reduce((sum, s) => sum + s[i]!, 0) / samples.length);
  const worst = Math.max(...samples.map((s) => s.reduce((sum, p, i) => sum + Math.abs(p - mean[i]!), 0) / 2));
  return { probabilities: mean, agreement: 1 - worst };
}
