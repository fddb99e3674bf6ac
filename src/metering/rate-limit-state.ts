import type { AccountSnapshot } from "./ledger.js";

/** For RateLimit-* headers: the rolling-minute limit. */
export interface RateLimitState {
  limit: number;
  remaining: number;
  /** Seconds until a slot frees (the oldest admission in the window leaves it). */
  resetSeconds: number;
}

/** The account's rolling-minute state as the headers show it: whole seconds, rounded up so a retry is never early. */
export function rateLimitStateOf(account: AccountSnapshot): RateLimitState {
  return { limit: account.rateLimit, remaining: account.rateRemaining, resetSeconds: ceilSeconds(account.rateResetMs) };
}

/** The rate-limit state for headers on an error response (the gateway reads these keys). */
export function rateLimitMetadata(account: AccountSnapshot): Record<string, string> {
  const rate = rateLimitStateOf(account);
  return {
    ratelimit_limit: String(rate.limit),
    ratelimit_remaining: String(rate.remaining),
    ratelimit_reset_seconds: String(rate.resetSeconds),
  };
}

/** Whole seconds, rounded up: a caller told to wait this long is never told too little. */
export function ceilSeconds(ms: number): number {
  return Math.ceil(ms / 1000);
}
