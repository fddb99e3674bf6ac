/**
 * Reading a first-position logprob window. The capability probe and the
 * decision engine both ask whether the model answered or opened a reasoning
 * block, so this sits with the client rather than with the answer math.
 */

/** One token of a completion with its log probability. */
export interface TokenLogprob {
  token: string;
  logprob: number;
}

/** The most probable entry of a window: what the model would say, unlike a token sampled at temperature 1. */
export function mostProbable(window: readonly TokenLogprob[]): TokenLogprob | undefined {
  let best: TokenLogprob | undefined;
  for (const entry of window) if (best === undefined || entry.logprob > best.logprob) best = entry;
  return best;
}

/** True when the first token opens a reasoning block instead of answering. */
export function isReasoningOpener(token: string | undefined): boolean {
  return token !== undefined && /^\s*<\/?(think|thinking|reasoning)\b|^\s*<\|/i.test(token);
}
