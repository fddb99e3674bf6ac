/**
 * Who must act: `rate_limited` — the provider asked us to wait; `auth` and
 * `quota` — the operator's key, User-Agent or plan (reported as not_configured
 * with the reason, logged once); `error` — anything else, with upstreamFault
 * false when the caller's query caused it (nothing is suspended then).
 */
export type FailureKind = "rate_limited" | "auth" | "quota" | "error";

/**
 * A classified upstream failure. `reason` is fixed text written by us: upstream
 * bodies, headers and keys never travel in it, because it reaches callers.
 */
export class SourceFailure extends Error {
  constructor(
    readonly kind: FailureKind,
    readonly reason: string,
    readonly opts: {
      /** How long the upstream asked us to stay away (Retry-After, backoff, rate reset). */
      retryAfterMs?: number | undefined;
      /**
       * False when this query caused the failure (GDELT's "phrase too short",
       * an arXiv error feed): such failures must not suspend the source for everyone.
       */
      upstreamFault?: boolean;
      cause?: unknown;
    } = {},
  ) {
    super(reason, { cause: opts.cause });
    this.name = "SourceFailure";
  }

  get upstreamFault(): boolean {
    return this.opts.upstreamFault ?? true;
  }
}
