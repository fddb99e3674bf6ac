import { Code } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { describeError } from "../../src/errors.js";
import { isRefusal, refusalError, type RefusedAdmission } from "../../src/metering/admission-refusal.js";
import type { AccountSnapshot, Admission } from "../../src/metering/ledger.js";

/**
 * Each refused admission and the API error that answers it: reason, gRPC
 * code, message, the field and rule it is about, and every figure in its
 * metadata (callers and the gateway's headers read these keys).
 */
const account: AccountSnapshot = {
  accountId: "3f6c1d2e-0000-4000-8000-000000000001",
  balanceUnits: 40_000,
  availableUnits: 8_000,
  freeRemaining: 3,
  freeAvailable: 1,
  rateLimit: 60,
  rateRemaining: 0,
  rateResetMs: 1_001,
  inFlight: 5,
  maxInFlight: 5,
};
/** What every refusal with an account carries for the RateLimit headers: the reset rounded up to whole seconds. */
const rateHeaders = { ratelimit_limit: "60", ratelimit_remaining: "0", ratelimit_reset_seconds: "2" };

it.each<{ admission: RefusedAdmission; reason: string; code: Code; message: string; field?: string; rule?: string; metadata: Record<string, string> }>([
  {
    admission: { outcome: "unauthenticated" },
    reason: "UNAUTHENTICATED",
    code: Code.Unauthenticated,
    message: "invalid API key: unknown or revoked",
    metadata: {},
  },
  {
    admission: { outcome: "key_expired", keyId: "9a1b2c3d-0000-4000-8000-000000000002", expiredAt: new Date("2031-03-06T00:00:00.000Z") },
    reason: "KEY_EXPIRED",
    code: Code.Unauthenticated,
    message: "this API key expired at 2031-03-06T00:00:00.000Z",
    metadata: { key_id: "9a1b2c3d-0000-4000-8000-000000000002", expired_at: "2031-03-06T00:00:00.000Z" },
  },
  {
    admission: { outcome: "key_scope_denied", keyId: "9a1b2c3d-0000-4000-8000-000000000002" },
    reason: "KEY_SCOPE_DENIED",
    code: Code.PermissionDenied,
    message: "this API key's scopes do not include this endpoint",
    metadata: { key_id: "9a1b2c3d-0000-4000-8000-000000000002" },
  },
  {
    admission: { outcome: "key_rate_limited", retryAfterMs: 1_500, ...account, rateLimit: 2 },
    reason: "RATE_LIMITED",
    code: Code.ResourceExhausted,
    message: "rate limit of this API key: at most 2 calls per rolling minute; retry in 2 s",
    metadata: {
      limit: "key_requests_per_minute",
      limit_value: "2",
      retry_after_seconds: "2",
      retry_after_ms: "1500",
      ...rateHeaders,
      ratelimit_limit: "2",
    },
  },
  {
    // Every figure differs, so a sign wrong in "left" (budget - spent - held) shows.
    admission: {
      outcome: "key_budget_exceeded",
      requiredUnits: 32_000,
      budget: { keyId: "9a1b2c3d-0000-4000-8000-000000000002", budgetUnits: 100_000, period: "day", spentUnits: 50_000, heldUnits: 20_000 },
      ...account,
    },
    reason: "KEY_BUDGET_EXCEEDED",
    code: Code.FailedPrecondition,
    message: "this API key's budget per day is 0.1 credits; this call reserves 0.032, 0.03 left",
    metadata: {
      key_id: "9a1b2c3d-0000-4000-8000-000000000002",
      budget_period: "day",
      budget_credits: "0.1",
      spent_credits: "0.05",
      held_credits: "0.02",
      left_credits: "0.03",
      required_credits: "0.032",
      budget_units: "100000",
      spent_units: "50000",
      held_units: "20000",
      required_units: "32000",
      ...rateHeaders,
    },
  },
  {
    admission: {
      outcome: "key_budget_exceeded",
      requiredUnits: 32_000,
      budget: { keyId: "9a1b2c3d-0000-4000-8000-000000000002", budgetUnits: 100_000, period: "total", spentUnits: 90_000, heldUnits: 20_000 },
      ...account,
    },
    reason: "KEY_BUDGET_EXCEEDED",
    code: Code.FailedPrecondition,
    message: "this API key's budget per total is 0.1 credits; this call reserves 0.032, 0 left",
    metadata: {
      key_id: "9a1b2c3d-0000-4000-8000-000000000002",
      budget_period: "total",
      budget_credits: "0.1",
      spent_credits: "0.09",
      held_credits: "0.02",
      left_credits: "0",
      required_credits: "0.032",
      budget_units: "100000",
      spent_units: "90000",
      held_units: "20000",
      required_units: "32000",
      ...rateHeaders,
    },
  },
  {
    admission: { outcome: "rate_limited", retryAfterMs: 1_500, ...account },
    reason: "RATE_LIMITED",
    code: Code.ResourceExhausted,
    message: "rate limit: at most 60 calls per rolling minute; retry in 2 s",
    metadata: { limit: "requests_per_minute", limit_value: "60", retry_after_seconds: "2", retry_after_ms: "1500", ...rateHeaders },
  },
  {
    admission: { outcome: "rate_limited", retryAfterMs: 1_000, ...account },
    reason: "RATE_LIMITED",
    code: Code.ResourceExhausted,
    message: "rate limit: at most 60 calls per rolling minute; retry in 1 s",
    metadata: { limit: "requests_per_minute", limit_value: "60", retry_after_seconds: "1", retry_after_ms: "1000", ...rateHeaders },
  },
  {
    admission: { outcome: "concurrency_limited", retryAfterMs: 1_000, ...account },
    reason: "CONCURRENCY_LIMITED",
    code: Code.ResourceExhausted,
    message: "concurrency limit: at most 5 calls in flight; retry in 1 s",
    metadata: { limit: "concurrent_requests", limit_value: "5", retry_after_seconds: "1", retry_after_ms: "1000", ...rateHeaders },
  },
  {
    admission: { outcome: "insufficient_balance", requiredUnits: 32_000, ...account },
    reason: "INSUFFICIENT_BALANCE",
    code: Code.FailedPrecondition,
    message: "insufficient balance: this call reserves 0.032 credits, 0.008 available",
    metadata: {
      required_credits: "0.032",
      available_credits: "0.008",
      required_units: "32000",
      available_units: "8000",
      free_requests_remaining: "1",
      ...rateHeaders,
    },
  },
  {
    admission: { outcome: "idempotency_in_progress", requestId: "req-in-flight", ...account },
    reason: "IDEMPOTENCY_IN_PROGRESS",
    code: Code.Aborted,
    message: "a request with this Idempotency-Key is still in flight; retry after it completes",
    field: "idempotency_key",
    rule: "one call at a time per key",
    metadata: { original_request_id: "req-in-flight", ...rateHeaders },
  },
  {
    admission: { outcome: "idempotency_mismatch", requestId: "req-first", ...account },
    reason: "IDEMPOTENCY_MISMATCH",
    code: Code.FailedPrecondition,
    message: "this Idempotency-Key was used with a different request",
    field: "idempotency_key",
    rule: "a key stands for one request body",
    metadata: { original_request_id: "req-first", ...rateHeaders },
  },
])("$admission.outcome is $reason: $message", ({ admission, reason, code, message, field = "", rule = "", metadata }) => {
  const error = refusalError(admission);
  const described = describeError(error);
  expect(described.reason).toBe(reason);
  expect(error.code).toBe(code);
  expect(described.message).toBe(message);
  expect({ field: described.detail.field, rule: described.detail.rule }).toEqual({ field, rule });
  expect(described.detail.metadata).toEqual(metadata);
});

describe("isRefusal", () => {
  it.each<[Admission["outcome"], boolean]>([
    ["admitted", false],
    ["replay", false],
    ["unauthenticated", true],
    ["key_expired", true],
    ["key_scope_denied", true],
    ["key_rate_limited", true],
    ["key_budget_exceeded", true],
    ["rate_limited", true],
    ["concurrency_limited", true],
    ["insufficient_balance", true],
    ["idempotency_in_progress", true],
    ["idempotency_mismatch", true],
  ])("%s → %s", (outcome, refused) => {
    expect(isRefusal({ outcome, ...account } as Admission)).toBe(refused);
  });
});
