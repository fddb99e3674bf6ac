import type { RateLimit } from "./source-config.js";

/**
 * Process-wide admission to each upstream: a token bucket (the provider's
 * published budget, shared by every caller of this process), a concurrency
 * cap (arXiv and GDELT want one connection) and suspension after 429s or
 * repeated failures. Upstream limits are per IP or per operator key, not per
 * account, so this state must be shared by all requests, never per request.
 */

export type Admission =
  | { granted: true; release(): void }
  | { granted: false; status: "suspended" | "rate_limited"; retryInMs: number };

export interface RateGate {
  /** Milliseconds left on the source's suspension; 0 when it may be called. */
  suspendedForMs(id: string): number;
  /**
   * Waits for a token and a connection slot until waitUntilMs (on the
   * injected clock); answers rate_limited without waiting when the next token
   * comes later than that, so no call is made that would break the budget.
   */
  acquire(id: string, opts: { waitUntilMs: number; signal: AbortSignal }): Promise<Admission>;
  /** Keeps the source away for at least ms (Retry-After, backoff, quota reset). */
  suspend(id: string, ms: number): void;
  recordSuccess(id: string): void;
  /** Counts a failure of the upstream; returns the suspension it caused (0 for none). */
  recordFailure(id: string): number;
}

/** Failures in a row before suspending; one failure may be a fluke, two are a pattern. */
export const FAILURES_BEFORE_SUSPENSION = 2;
export const FIRST_FAILURE_SUSPENSION_MS = 5_000;
export const MAX_FAILURE_SUSPENSION_MS = 120_000;

interface State {
  limit: RateLimit;
  tokens: number;
  refilledAt: number;
  inFlight: number;
  slotWaiters: Array<() => void>;
  suspendedUntil: number;
  failuresInRow: number;
}

export function createRateGate(opts: { limits: Record<string, RateLimit>; now: () => number }): RateGate {
  const { now } = opts;
  const states = new Map<string, State>();
  const stateOf = (id: string): State => {
    let state = states.get(id);
    if (!state) {
      const limit = opts.limits[id];
      if (!limit) throw new Error(`no rate limit for source ${id}`);
      state = { limit, tokens: limit.count, refilledAt: now(), inFlight: 0, slotWaiters: [], suspendedUntil: 0, failuresInRow: 0 };
      states.set(id, state);
    }
    return state;
  };
  const refill = (state: State, t: number) => {
    const perMs = state.limit.count / state.limit.intervalMs;
    state.tokens = Math.min(state.limit.count, state.tokens + Math.max(0, t - state.refilledAt) * perMs);
    state.refilledAt = Math.max(state.refilledAt, t);
  };
  const suspendedForMs = (id: string) => Math.max(0, stateOf(id).suspendedUntil - now());

  return {
    suspendedForMs,
    async acquire(id, { waitUntilMs, signal }) {
      const state = stateOf(id);
      for (;;) {
        signal.throwIfAborted();
        const suspended = suspendedForMs(id);
        if (suspended > 0) return { granted: false, status: "suspended", retryInMs: suspended };
        const t = now();
        if (state.inFlight >= state.limit.concurrency) {
          if (t >= waitUntilMs) return { granted: false, status: "rate_limited", retryInMs: 0 };
          await waitFor(waitUntilMs - t, signal, (wake) => state.slotWaiters.push(wake));
          continue;
        }
        refill(state, t);
        if (state.tokens >= 1) {
          state.tokens -= 1;
          state.inFlight += 1;
          let released = false;
          return {
            granted: true,
            release() {
              if (released) return;
              released = true;
              state.inFlight -= 1;
              for (const wake of state.slotWaiters.splice(0)) wake();
            },
          };
        }
        const perMs = state.limit.count / state.limit.intervalMs;
        const nextAt = t + Math.ceil((1 - state.tokens) / perMs);
        if (nextAt > waitUntilMs) return { granted: false, status: "rate_limited", retryInMs: nextAt - t };
        await waitFor(nextAt - t, signal);
      }
    },
    suspend(id, ms) {
      const state = stateOf(id);
      state.suspendedUntil = Math.max(state.suspendedUntil, now() + ms);
    },
    recordSuccess(id) {
      stateOf(id).failuresInRow = 0;
    },
    recordFailure(id) {
      const state = stateOf(id);
      // Calls that were in flight when the suspension began fail together: one step, not one per call.
      if (now() < state.suspendedUntil) return 0;
      state.failuresInRow += 1;
      if (state.failuresInRow < FAILURES_BEFORE_SUSPENSION) return 0;
      const doublings = Math.min(10, state.failuresInRow - FAILURES_BEFORE_SUSPENSION);
      const ms = Math.min(MAX_FAILURE_SUSPENSION_MS, FIRST_FAILURE_SUSPENSION_MS * 2 ** doublings);
      state.suspendedUntil = Math.max(state.suspendedUntil, now() + ms);
      return ms;
    },
  };
}

/**
 * Resolves after ms, on an optional wake-up (a freed slot) or rejects on abort.
 * The timer is unref'd: a waiting search must not keep the process alive.
 */
function waitFor(ms: number, signal: AbortSignal, register?: (wake: () => void) => void): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    let done = false;
    const finish = (err?: unknown) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
      if (err === undefined) resolve();
      else reject(err);
    };
    const onAbort = () => finish(signal.reason ?? new Error("aborted"));
    const timer = setTimeout(() => finish(), Math.max(0, ms));
    timer.unref();
    signal.addEventListener("abort", onAbort, { once: true });
    register?.(() => finish());
  });
}
