/**
 * What one call to a model is, whichever model answers it (an
 * OpenAI-compatible server or the model in this process): the messages it
 * reads, the request's signal, deadline and fair-share party, the tokens it
 * used, and how it failed.
 */

export interface ChatMessage {
  role: "system" | "user" | "assistant";
  content: string;
}

export interface CallOptions {
  signal: AbortSignal;
  deadlineMs: number;
  /**
   * Who the call is for (one decision request): the concurrent-call slots go
   * round-robin between parties, so a 40-question request cannot starve a
   * 1-question one queued behind it.
   */
  party?: object;
}

export interface ChatUsage {
  /** All prompt tokens, cached ones included. */
  promptTokens: number;
  cachedTokens: number;
  completionTokens: number;
}

export type LlmCallErrorCode = "timeout" | "upstream_error" | "rejected" | "aborted";

/** A failed call. The message is fixed text: no upstream body ever goes in it. */
export class LlmCallError extends Error {
  constructor(
    readonly code: LlmCallErrorCode,
    readonly retryable: boolean,
    readonly status?: number,
  ) {
    super(status === undefined ? `llm call failed: ${code}` : `llm call failed: ${code} (HTTP ${status})`);
    this.name = "LlmCallError";
  }
}
