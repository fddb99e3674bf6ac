import type { SearchWindow } from "./validate.js";

/**
 * Answer cache and single-flight for upstream calls. Per process and
 * bounded: its job is to spare free upstreams with strict shared limits
 * (arXiv, GDELT) and to make repeated queries free for callers, not to be a
 * shared store. The clock is injected so TTLs are tested without waiting.
 */

const MINUTE = 60_000;

/** TTL by window: the fresher the window, the sooner a cached answer goes stale. */
export const TTL_MS: Record<SearchWindow, number> = { "24h": 5 * MINUTE, "7d": 15 * MINUTE, "30d": 60 * MINUTE, any: 60 * MINUTE };
/** Empty answers are kept briefly: "nothing yet" is the answer most likely to change. */
export const EMPTY_TTL_MS = 5 * MINUTE;

/**
 * Same source, adapter version, normalized query, window and filters ⇒ same
 * upstream answer. Without filters the key is what it always was.
 */
export function cacheKey(source: string, version: number, query: string, window: SearchWindow, filters = ""): string {
  return filters === "" ? JSON.stringify([source, version, window, query]) : JSON.stringify([source, version, window, query, filters]);
}

/** NFC, trimmed, whitespace collapsed; case kept, because some upstreams are case-sensitive. */
export function normalizeQuery(q: string): string {
  return q.normalize("NFC").replace(/\s+/g, " ").trim();
}

export interface TtlCache<V> {
  get(key: string): V | undefined;
  set(key: string, value: V, ttlMs: number): void;
  readonly size: number;
}

/** A TTL map that evicts the least recently written entry past maxEntries. */
export function createTtlCache<V>(opts: { now: () => number; maxEntries: number }): TtlCache<V> {
  const entries = new Map<string, { value: V; expiresAt: number }>();
  return {
    get(key) {
      const entry = entries.get(key);
      if (!entry) return undefined;
      if (opts.now() >= entry.expiresAt) {
        entries.delete(key);
        return undefined;
      }
      return entry.value;
    },
    set(key, value, ttlMs) {
      if (opts.maxEntries <= 0 || ttlMs <= 0) return;
      entries.delete(key);
      entries.set(key, { value, expiresAt: opts.now() + ttlMs });
      while (entries.size > opts.maxEntries) {
        const oldest = entries.keys().next().value;
        if (oldest === undefined) break;
        entries.delete(oldest);
      }
    },
    get size() {
      return entries.size;
    },
  };
}

export interface SingleFlight<T> {
  /**
   * Runs work once per key among concurrent callers. The work gets its own
   * signal, aborted only when every waiter has given up, so one caller's
   * cancellation never fails another caller's search.
   */
  run(key: string, signal: AbortSignal, work: (signal: AbortSignal) => Promise<T>): Promise<{ value: T; leader: boolean }>;
  readonly inFlight: number;
}

export function createSingleFlight<T>(): SingleFlight<T> {
  const flights = new Map<string, { promise: Promise<T>; waiters: number; controller: AbortController }>();
  return {
    run(key, signal, work) {
      let flight = flights.get(key);
      const leader = flight === undefined;
      if (!flight) {
        const controller = new AbortController();
        const created: { promise: Promise<T>; waiters: number; controller: AbortController } = {
          promise: Promise.resolve().then(() => work(controller.signal)),
          waiters: 0,
          controller,
        };
        const forget = () => {
          if (flights.get(key) === created) flights.delete(key);
        };
        created.promise.then(forget, forget);
        flights.set(key, created);
        flight = created;
      }
      const current = flight;
      current.waiters += 1;
      return new Promise<{ value: T; leader: boolean }>((resolve, reject) => {
        let settled = false;
        const leave = () => {
          if (settled) return;
          settled = true;
          signal.removeEventListener("abort", onAbort);
          current.waiters -= 1;
        };
        const onAbort = () => {
          if (settled) return;
          leave();
          if (current.waiters === 0) {
            if (flights.get(key) === current) flights.delete(key);
            current.controller.abort(signal.reason);
          }
          reject(signal.reason);
        };
        if (signal.aborted) {
          onAbort();
          return;
        }
        signal.addEventListener("abort", onAbort, { once: true });
        current.promise.then(
          (value) => {
            leave();
            resolve({ value, leader });
          },
          (err: unknown) => {
            leave();
            reject(err);
          },
        );
      });
    },
    get inFlight() {
      return flights.size;
    },
  };
}
