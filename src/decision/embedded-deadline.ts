import type { LlmConfig } from "../config.js";
import type { DecisionEngines } from "./engine-choice.js";
import type { ChatMessage } from "../upstream/model-call.js";
import type { ModelPace } from "../upstream/model-pace.js";
import { firstCallMessages, type QuestionSpec } from "./engine.js";

/**
 * The time a decision on the embedded model is given. The model works through
 * its queue at a rate this machine measured, so a call that waits behind
 * others, or asks many questions on a slow machine, needs longer than the
 * configured deadline while making steady progress: it gets the time its
 * tokens and those queued ahead need. A call that cannot finish within the
 * longest wait allowed (or the caller's own deadline) is refused at once,
 * with the estimate, before any money moves.
 */

/** The measured rate is for prompt batches; label continuations and the work around them cost more. */
export const ESTIMATE_MARGIN = 1.5;

export type EmbeddedDeadline =
  | { run: true; timeoutMs: number; estimateMs: number | undefined }
  /** `retryAfterMs`: when the queue ahead will have drained; absent when the call alone needs more than the limit. */
  | { run: false; estimateMs: number; limitMs: number; limitedBy: "max_wait" | "caller_deadline"; retryAfterMs: number | undefined };

export function embeddedDeadline(input: {
  /** The configured deadline of a decision: never shortened. */
  configuredMs: number;
  /** The longest a decision on the embedded model may be given. */
  maxWaitMs: number;
  /** The caller's own deadline, when it sent one. */
  callerMs: number | undefined;
  ownTokens: number;
  queuedTokens: number;
  /** undefined until the model has evaluated something: then only the configured deadline is known. */
  tokensPerSecond: number | undefined;
}): EmbeddedDeadline {
  const rate = input.tokensPerSecond;
  if (rate === undefined || !(rate > 0)) return { run: true, timeoutMs: input.configuredMs, estimateMs: undefined };
  const msFor = (tokens: number) => Math.ceil((tokens / rate) * 1000 * ESTIMATE_MARGIN);
  const estimateMs = msFor(input.queuedTokens + input.ownTokens);
  const ownLimitMs = Math.max(input.maxWaitMs, input.configuredMs);
  const limitMs = input.callerMs === undefined ? ownLimitMs : Math.min(ownLimitMs, input.callerMs);
  if (estimateMs > limitMs) {
    const limitedBy = input.callerMs !== undefined && input.callerMs < ownLimitMs ? "caller_deadline" : "max_wait";
    return { run: false, estimateMs, limitMs, limitedBy, retryAfterMs: msFor(input.ownTokens) <= limitMs ? Math.max(1000, msFor(input.queuedTokens)) : undefined };
  }
  return { run: true, timeoutMs: Math.max(input.configuredMs, estimateMs), estimateMs };
}

/**
 * The fewest prompt tokens the questions of one call need: the prefix all
 * their prompts share, once per sequence that may serve them, and each
 * prompt's own tokens once.
 */
export function plannedTokens<T>(prompts: readonly (readonly T[])[], sequences: number): number {
  if (prompts.length === 0) return 0;
  let shared = Math.min(...prompts.map((p) => p.length));
  const first = prompts[0]!;
  for (const prompt of prompts) {
    let i = 0;
    while (i < shared && prompt[i] === first[i]) i++;
    shared = i;
  }
  const own = prompts.reduce((sum, p) => sum + p.length - shared, 0);
  return Math.min(sequences, prompts.length) * shared + own;
}

/** A call planned on the embedded model: it runs with `timeoutMs` and gives its booked tokens back when it ends, or it is refused. */
export type EmbeddedCallPlan =
  | { run: true; timeoutMs: number; giveBack(): void }
  | { run: false; refusal: Extract<EmbeddedDeadline, { run: false }>; ownTokens: number; queuedTokens: number };

/**
 * Plans one call of `questions` on the embedded model: counts its tokens with
 * the model's tokenizer, sets its deadline from the queue ahead, and books
 * its tokens into the queue while it runs. A Decide call and an evaluation's
 * example both plan here, so each waits for the other as the model does.
 */
export function planEmbeddedCall(input: {
  model: { promptTokens(messages: readonly ChatMessage[]): readonly unknown[] };
  pace: ModelPace;
  stateBlock: string;
  questions: readonly QuestionSpec[];
  sequences: number;
  configuredMs: number;
  maxWaitMs: number;
  callerMs: number | undefined;
}): EmbeddedCallPlan {
  const ownTokens = plannedTokens(
    input.questions.map((q) => input.model.promptTokens(firstCallMessages(input.stateBlock, q))),
    input.sequences,
  );
  const queuedTokens = input.pace.queuedTokens();
  const plan = embeddedDeadline({
    configuredMs: input.configuredMs,
    maxWaitMs: input.maxWaitMs,
    callerMs: input.callerMs,
    ownTokens,
    queuedTokens,
    tokensPerSecond: input.pace.tokensPerSecond(),
  });
  if (!plan.run) return { run: false, refusal: plan, ownTokens, queuedTokens };
  return { run: true, timeoutMs: plan.timeoutMs, giveBack: input.pace.book(ownTokens) };
}

/**
 * The deadline of a call of these questions, for the API's decisions and the
 * evaluation's examples alike: the configured one on an upstream; on the
 * embedded model, what its tokens and those queued ahead need (booked until
 * `giveBack`), or a refusal when that is past the longest wait or `callerMs`.
 */
export function planDecision(
  engines: DecisionEngines,
  llm: Pick<LlmConfig, "requestTimeoutMs" | "embedded">,
  stateBlock: string,
  questions: readonly QuestionSpec[],
  callerMs: number | undefined,
): EmbeddedCallPlan {
  const model = engines.kind === "embedded" ? engines.host.model() : undefined;
  if (!model || engines.kind !== "embedded") return { run: true, timeoutMs: llm.requestTimeoutMs, giveBack: () => {} };
  const { sequences, maxWaitMs } = llm.embedded;
  return planEmbeddedCall({ model, pace: engines.host.pace, stateBlock, questions, sequences, configuredMs: llm.requestTimeoutMs, maxWaitMs, callerMs });
}
