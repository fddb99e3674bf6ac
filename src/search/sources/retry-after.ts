/** How long a provider asks us to stay away, read from its answer and kept within bounds. */

/** Retry-After as delta seconds or an HTTP date, at most MAX_PAUSE_MS; undefined when absent or unreadable. */
export function retryAfterMs(headers: Headers, nowMs: number): number | undefined {
  const raw = headers.get("retry-after")?.trim();
  if (!raw) return undefined;
  if (/^\d+$/.test(raw)) return clampPauseMs(Number(raw) * 1000);
  const at = Date.parse(raw);
  return Number.isNaN(at) ? undefined : clampPauseMs(at - nowMs);
}

/**
 * Longest pause an upstream can impose on a source (a day covers Stack
 * Exchange's daily quota). An absurd Retry-After or backoff must not suspend
 * a source for ever.
 */
export const MAX_PAUSE_MS = 24 * 3600_000;

/** A requested pause within 0..MAX_PAUSE_MS. */
export function clampPauseMs(ms: number): number {
  return Number.isNaN(ms) ? MAX_PAUSE_MS : Math.min(MAX_PAUSE_MS, Math.max(0, ms));
}
