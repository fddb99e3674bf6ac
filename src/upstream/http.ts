import http from "node:http";
import https from "node:https";

/**
 * The one HTTP wrapper for upstream calls: a per-attempt timeout, cancellation
 * through the caller's signal, and bounded retries with jittered backoff on
 * 429/5xx/network errors that never run past the call's deadline.
 *
 * Upstream bodies are returned to the client module that asked (it may need
 * to classify a 400), but errors thrown from here carry only a status and a
 * kind: no body text and no header values, so nothing an upstream says can
 * reach a caller or a log line through an error message.
 */
export interface HttpCall {
  url: string;
  headers: Record<string, string>;
  /** JSON text sent with POST. */
  body: string;
}

export interface HttpCallOptions {
  /** Aborts the call and any retry wait (the caller went away or the request deadline passed). */
  signal: AbortSignal;
  /** Epoch milliseconds after which no attempt starts and running attempts are cut. */
  deadlineMs: number;
  /** Timeout of one attempt. */
  attemptTimeoutMs: number;
  /** Retries after the first attempt. */
  maxRetries: number;
  /** First backoff step; doubles per retry, with full jitter. */
  baseDelayMs?: number;
  maxDelayMs?: number;
  /** Injected for tests that must not depend on Math.random. */
  random?: () => number;
  /**
   * Takes a slot of a shared limit for one attempt (undefined: the signal
   * aborted while waiting). Held only while the attempt runs, never through a
   * backoff or Retry-After wait.
   */
  slot?: (signal: AbortSignal) => Promise<(() => void) | undefined>;
}

export interface HttpResponse {
  status: number;
  /** Response text; the caller must never forward it. */
  text: string;
  /** Attempts made, retries included. */
  attempts: number;
}

export type UpstreamErrorKind = "timeout" | "network" | "aborted";

/** A call that produced no HTTP response at all. Its message is fixed text. */
export class UpstreamError extends Error {
  constructor(
    readonly kind: UpstreamErrorKind,
    readonly attempts: number,
  ) {
    super(`upstream call failed: ${kind}`);
    this.name = "UpstreamError";
  }
}

/** Statuses worth another attempt: rate limits and server-side failures. */
export function isRetryableStatus(status: number): boolean {
  return status === 408 || status === 429 || status >= 500;
}

/**
 * POSTs `call.body` and returns the final response. A 429/5xx that is still
 * failing after the last retry is returned, not thrown, so the caller can
 * classify it; only a missing response (timeout, network, abort) throws.
 */
export async function postWithRetry(call: HttpCall, options: HttpCallOptions): Promise<HttpResponse> {
  const baseDelayMs = options.baseDelayMs ?? 200;
  const maxDelayMs = options.maxDelayMs ?? 2_000;
  const random = options.random ?? Math.random;
  let attempts = 0;
  for (;;) {
    if (options.signal.aborted) throw new UpstreamError("aborted", attempts);
    const release = options.slot ? await options.slot(options.signal) : () => undefined;
    if (!release) throw new UpstreamError("aborted", attempts);
    const remainingMs = options.deadlineMs - Date.now();
    if (remainingMs <= 0) {
      release();
      throw new UpstreamError("timeout", attempts);
    }
    attempts += 1;
    const outcome = await attempt(call, options.signal, Math.min(options.attemptTimeoutMs, remainingMs)).finally(release);
    const canRetry = attempts <= options.maxRetries;
    if (outcome.kind === "response") {
      const { status, text, retryAfterMs } = outcome;
      if (!isRetryableStatus(status) || !canRetry) return { status, text, attempts };
      const waitMs = retryAfterMs ?? backoffMs(attempts, baseDelayMs, maxDelayMs, random);
      if (Date.now() + waitMs >= options.deadlineMs) return { status, text, attempts };
      if (!(await wait(waitMs, options.signal))) throw new UpstreamError("aborted", attempts);
      continue;
    }
    if (outcome.kind === "aborted") throw new UpstreamError("aborted", attempts);
    if (!canRetry) throw new UpstreamError(outcome.kind, attempts);
    const waitMs = backoffMs(attempts, baseDelayMs, maxDelayMs, random);
    if (Date.now() + waitMs >= options.deadlineMs) throw new UpstreamError(outcome.kind, attempts);
    if (!(await wait(waitMs, options.signal))) throw new UpstreamError("aborted", attempts);
  }
}

type AttemptOutcome =
  | { kind: "response"; status: number; text: string; retryAfterMs: number | undefined }
  | { kind: "timeout" | "network" | "aborted" };

/**
 * Keep-alive agents shared by every upstream call of the process: node:http
 * costs a fraction of fetch's CPU per call (no WHATWG streams, no Response
 * object), which on a 40-question decision is paid forty times.
 */
const agents = {
  "http:": new http.Agent({ keepAlive: true, maxFreeSockets: 256 }),
  "https:": new https.Agent({ keepAlive: true, maxFreeSockets: 256 }),
};

async function attempt(call: HttpCall, signal: AbortSignal, timeoutMs: number): Promise<AttemptOutcome> {
  const cut = { timedOut: false };
  try {
    const { status, text, retryAfter } = await post(call, signal, timeoutMs, cut);
    return { kind: "response", status, text, retryAfterMs: parseRetryAfterMs(retryAfter ?? null) };
  } catch {
    if (signal.aborted) return { kind: "aborted" };
    return { kind: cut.timedOut ? "timeout" : "network" };
  }
}

/**
 * One POST and its whole answer; rejects on a network error, or when `signal`
 * aborts or `timeoutMs` passes (the socket is destroyed, and `cut.timedOut`
 * tells which). One timer and one listener on the caller's signal, instead of
 * a linked AbortController handed to node:http (which adds listeners of its
 * own): a 40-question decision makes forty of these.
 */
function post(
  call: HttpCall,
  signal: AbortSignal,
  timeoutMs: number,
  cut: { timedOut: boolean },
): Promise<{ status: number; text: string; retryAfter: string | undefined }> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const url = new URL(call.url);
    const send = url.protocol === "https:" ? https.request : http.request;
    const req = send(
      url,
      {
        method: "POST",
        agent: agents[url.protocol as keyof typeof agents],
        headers: {
          "content-type": "application/json",
          accept: "application/json",
          "content-length": Buffer.byteLength(call.body),
          ...call.headers,
        },
      },
      (res) => {
        res.setEncoding("utf8");
        let text = "";
        res.on("data", (chunk: string) => (text += chunk));
        res.on("end", () => {
          settle();
          resolve({ status: res.statusCode ?? 0, text, retryAfter: headerValue(res.headers["retry-after"]) });
        });
        res.on("error", fail);
      },
    );
    const onAbort = () => req.destroy(signal.reason instanceof Error ? signal.reason : new Error("aborted"));
    const timer = setTimeout(() => {
      cut.timedOut = true;
      req.destroy(new Error(`timed out after ${timeoutMs} ms`));
    }, timeoutMs);
    function settle() {
      clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
    }
    function fail(err: unknown) {
      settle();
      reject(err);
    }
    signal.addEventListener("abort", onAbort, { once: true });
    req.on("error", fail);
    req.end(call.body);
  });
}

function headerValue(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}

/** Retry-After in seconds (the HTTP-date form is rare from LLM APIs and ignored). Capped at 10 s. */
export function parseRetryAfterMs(header: string | null): number | undefined {
  if (header === null || !/^\d+(\.\d+)?$/.test(header.trim())) return undefined;
  return Math.min(Number(header) * 1_000, 10_000);
}

/** Full-jitter exponential backoff: uniform in [0, min(max, base·2^(n-1))]. */
export function backoffMs(retry: number, baseDelayMs: number, maxDelayMs: number, random: () => number): number {
  return Math.floor(random() * Math.min(maxDelayMs, baseDelayMs * 2 ** (retry - 1)));
}

/** Resolves true after `ms`, or false as soon as the signal aborts. */
function wait(ms: number, signal: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(false);
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve(true);
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      resolve(false);
    };
    signal.addEventListener("abort", onAbort, { once: true });
  });
}
