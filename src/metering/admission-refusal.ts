import type { ConnectError } from "@connectrpc/connect";
import { apiError } from "../errors.js";
import { unitsToCredits } from "../units.js";
import type { Admission } from "./ledger.js";
import { ceilSeconds, rateLimitMetadata } from "./rate-limit-state.js";

/** An admission that lets the call neither run nor replay: each is answered with an API error. */
export type RefusedAdmission = Exclude<Admission, { outcome: "admitted" | "replay" }>;

type Refusals = { [O in RefusedAdmission["outcome"]]: (admission: Extract<RefusedAdmission, { outcome: O }>) => ConnectError };

/**
 * The API error of each refusal. Every refusal but an unknown key also
 * carries the account's rate-limit state, so its answer has the same
 * RateLimit headers as a success. Amounts are given in credits for people and
 * in units for programs.
 */
const REFUSALS: Refusals = {
  unauthenticated: () => apiError("UNAUTHENTICATED", "invalid API key: unknown or revoked"),
  key_expired: (admission) =>
    apiError("KEY_EXPIRED", `this API key expired at ${admission.expiredAt.toISOString()}`, {
      metadata: { key_id: admission.keyId, expired_at: admission.expiredAt.toISOString() },
    }),
  key_scope_denied: (admission) =>
    apiError("KEY_SCOPE_DENIED", "this API key's scopes do not include this endpoint", {
      metadata: { key_id: admission.keyId },
    }),
  key_rate_limited: (admission) => {
    const seconds = ceilSeconds(admission.retryAfterMs);
    return apiError("RATE_LIMITED", `rate limit of this API key: at most ${admission.rateLimit} calls per rolling minute; retry in ${seconds} s`, {
      metadata: {
        limit: "key_requests_per_minute",
        limit_value: String(admission.rateLimit),
        retry_after_seconds: String(seconds),
        retry_after_ms: String(admission.retryAfterMs),
        ...rateLimitMetadata(admission),
      },
    });
  },
  key_budget_exceeded: (admission) => {
    const { budget } = admission;
    const left = Math.max(budget.budgetUnits - budget.spentUnits - budget.heldUnits, 0);
    return apiError(
      "KEY_BUDGET_EXCEEDED",
      `this API key's budget per ${budget.period} is ${unitsToCredits(budget.budgetUnits)} credits; ` +
        `this call reserves ${unitsToCredits(admission.requiredUnits)}, ${unitsToCredits(left)} left`,
      {
        metadata: {
          key_id: budget.keyId,
          budget_period: budget.period,
          budget_credits: String(unitsToCredits(budget.budgetUnits)),
          spent_credits: String(unitsToCredits(budget.spentUnits)),
          held_credits: String(unitsToCredits(budget.heldUnits)),
          left_credits: String(unitsToCredits(left)),
          required_credits: String(unitsToCredits(admission.requiredUnits)),
          budget_units: String(budget.budgetUnits),
          spent_units: String(budget.spentUnits),
          held_units: String(budget.heldUnits),
          required_units: String(admission.requiredUnits),
          ...rateLimitMetadata(admission),
        },
      },
    );
  },
  rate_limited: (admission) => {
    const seconds = ceilSeconds(admission.retryAfterMs);
    return apiError("RATE_LIMITED", `rate limit: at most ${admission.rateLimit} calls per rolling minute; retry in ${seconds} s`, {
      metadata: {
        limit: "requests_per_minute",
        limit_value: String(admission.rateLimit),
        retry_after_seconds: String(seconds),
        retry_after_ms: String(admission.retryAfterMs),
        ...rateLimitMetadata(admission),
      },
    });
  },
  concurrency_limited: (admission) => {
    const seconds = ceilSeconds(admission.retryAfterMs);
    return apiError("CONCURRENCY_LIMITED", `concurrency limit: at most ${admission.maxInFlight} calls in flight; retry in ${seconds} s`, {
      metadata: {
        limit: "concurrent_requests",
        limit_value: String(admission.maxInFlight),
        retry_after_seconds: String(seconds),
        retry_after_ms: String(admission.retryAfterMs),
        ...rateLimitMetadata(admission),
      },
    });
  },
  insufficient_balance: (admission) =>
    apiError(
      "INSUFFICIENT_BALANCE",
      `insufficient balance: this call reserves ${unitsToCredits(admission.requiredUnits)} credits, ${unitsToCredits(admission.availableUnits)} available`,
      {
        metadata: {
          required_credits: String(unitsToCredits(admission.requiredUnits)),
          available_credits: String(unitsToCredits(admission.availableUnits)),
          required_units: String(admission.requiredUnits),
          available_units: String(admission.availableUnits),
          free_requests_remaining: String(admission.freeAvailable),
          ...rateLimitMetadata(admission),
        },
      },
    ),
  idempotency_in_progress: (admission) =>
    apiError("IDEMPOTENCY_IN_PROGRESS", "a request with this Idempotency-Key is still in flight; retry after it completes", {
      field: "idempotency_key",
      rule: "one call at a time per key",
      metadata: { original_request_id: admission.requestId, ...rateLimitMetadata(admission) },
    }),
  idempotency_mismatch: (admission) =>
    apiError("IDEMPOTENCY_MISMATCH", "this Idempotency-Key was used with a different request", {
      field: "idempotency_key",
      rule: "a key stands for one request body",
      metadata: { original_request_id: admission.requestId, ...rateLimitMetadata(admission) },
    }),
};

/** The API error (401, 403, 429, 402, 409 or 422, with its metadata) that answers a refused admission. */
export function refusalError(admission: RefusedAdmission): ConnectError {
  return (REFUSALS[admission.outcome] as (refused: RefusedAdmission) => ConnectError)(admission);
}

/** True when the admission refuses the call (neither admitted nor a replay of a settled one). */
export function isRefusal(admission: Admission): admission is RefusedAdmission {
  return admission.outcome !== "admitted" && admission.outcome !== "replay";
}
