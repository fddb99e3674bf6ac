import { Code, ConnectError } from "@connectrpc/connect";
import { create, type DescMessage, type Message } from "@bufbuild/protobuf";
import { DurationSchema } from "@bufbuild/protobuf/wkt";
import { isDatabaseUnavailable } from "./db/unavailable.js";
import { BadRequestSchema, RetryInfoSchema } from "./gen/google/rpc/error_details_pb.js";
import { ErrorDetailSchema, type ErrorDetail } from "./gen/typesafe/error/v1/error_pb.js";

/**
 * Every error reason the service can return, with its gRPC code, HTTP status
 * and envelope code. This table is the single source of truth: the gateway,
 * gRPC callers and the README's error table all derive from it. Envelope codes
 * are the HTTP status times 100 plus a running number, and never change.
 */
export const REASONS = {
  INVALID_ARGUMENT: { grpc: Code.InvalidArgument, http: 400, envelope: 40001, meaning: "Invalid input: a field broke a rule." },
  MALFORMED_JSON: { grpc: Code.InvalidArgument, http: 400, envelope: 40002, meaning: "The body is not valid JSON." },
  MALFORMED_MESSAGE: { grpc: Code.InvalidArgument, http: 400, envelope: 40003, meaning: "The body is not a valid protobuf message of the request type (gRPC and Connect binary)." },
  UNAUTHENTICATED: { grpc: Code.Unauthenticated, http: 401, envelope: 40101, meaning: "Missing, malformed, unknown or revoked API key." },
  SIGNED_OUT: { grpc: Code.Unauthenticated, http: 401, envelope: 40102, meaning: "Account area: no live session (never an API key); sign in." },
  SIGN_IN_FAILED: { grpc: Code.Unauthenticated, http: 401, envelope: 40103, meaning: "Account area: wrong email or password (the same answer for both)." },
  KEY_EXPIRED: { grpc: Code.Unauthenticated, http: 401, envelope: 40104, meaning: "The API key passed its expiry (set in the account area or by the operator, or by a roll); use its successor." },
  SECOND_STEP_FAILED: { grpc: Code.Unauthenticated, http: 401, envelope: 40105, meaning: "Account area: a wrong, used or late code at the second step of sign-in, or its token expired." },
  INSUFFICIENT_BALANCE: { grpc: Code.FailedPrecondition, http: 402, envelope: 40201, meaning: "Available balance does not cover the reservation." },
  KEY_BUDGET_EXCEEDED: { grpc: Code.FailedPrecondition, http: 402, envelope: 40202, meaning: "The API key's budget for this period does not cover the reservation." },
  CROSS_SITE_REFUSED: { grpc: Code.PermissionDenied, http: 403, envelope: 40301, meaning: "Account area: the call came from another site's page (its Origin)." },
  KEY_SCOPE_DENIED: { grpc: Code.PermissionDenied, http: 403, envelope: 40302, meaning: "The API key's scopes do not include this endpoint (decisions or search)." },
  ROLE_FORBIDDEN: { grpc: Code.PermissionDenied, http: 403, envelope: 40303, meaning: "Account area: the member's role does not allow this; data.rule names the rule." },
  LAST_OWNER: { grpc: Code.PermissionDenied, http: 403, envelope: 40304, meaning: "Account area: the account's last owner cannot be removed or demoted." },
  TWO_FACTOR_REQUIRED: { grpc: Code.PermissionDenied, http: 403, envelope: 40305, meaning: "Account area: the account requires two-factor sign-in; enroll a second factor first." },
  NOT_FOUND: { grpc: Code.NotFound, http: 404, envelope: 40401, meaning: "No such path." },
  METHOD_NOT_ALLOWED: { grpc: Code.Unimplemented, http: 405, envelope: 40501, meaning: "The path does not accept this HTTP method." },
  IDEMPOTENCY_IN_PROGRESS: { grpc: Code.Aborted, http: 409, envelope: 40901, meaning: "A request with this Idempotency-Key is still in flight." },
  KEY_LIMIT_REACHED: { grpc: Code.FailedPrecondition, http: 409, envelope: 40902, meaning: "Account area: the account has as many live keys as it may; revoke one first." },
  EVALUATION_STATE: { grpc: Code.FailedPrecondition, http: 409, envelope: 40903, meaning: "Account area: the evaluation's state does not allow this (resume a stopped one; delete one that is not running)." },
  INVITE_INVALID: { grpc: Code.FailedPrecondition, http: 410, envelope: 41001, meaning: "Account area: the invite is unknown, used or expired; ask an owner, an admin or the operator for a new one." },
  PAYLOAD_TOO_LARGE: { grpc: Code.ResourceExhausted, http: 413, envelope: 41301, meaning: "The body exceeds its bound: 96 KB, or 64 MiB for an evaluation upload." },
  UNSUPPORTED_MEDIA_TYPE: { grpc: Code.InvalidArgument, http: 415, envelope: 41501, meaning: "The body must be application/json (multipart/form-data for an evaluation upload)." },
  UNSUPPORTED_ENCODING: { grpc: Code.Unimplemented, http: 415, envelope: 41502, meaning: "The body's encoding is not one the server accepts (identity, gzip, br); the answer lists them." },
  IDEMPOTENCY_MISMATCH: { grpc: Code.FailedPrecondition, http: 422, envelope: 42201, meaning: "The Idempotency-Key was used with a different body." },
  RATE_LIMITED: { grpc: Code.ResourceExhausted, http: 429, envelope: 42901, meaning: "More than 60 calls in a rolling minute, or more than the API key's own limit." },
  CONCURRENCY_LIMITED: { grpc: Code.ResourceExhausted, http: 429, envelope: 42902, meaning: "More than 5 calls in flight." },
  SIGN_IN_THROTTLED: { grpc: Code.ResourceExhausted, http: 429, envelope: 42903, meaning: "Account area: 5 failed sign-ins (or second steps) for this email within 15 minutes; wait Retry-After." },
  PASSWORD_CHECKS_BUSY: { grpc: Code.ResourceExhausted, http: 429, envelope: 42904, meaning: "Account area: too many password checks are waiting, from this client or in all; wait Retry-After." },
  UPLOADS_BUSY: { grpc: Code.ResourceExhausted, http: 429, envelope: 42905, meaning: "Account area: the service is reading as many evaluation uploads as it reads at once; wait Retry-After." },
  CANCELLED: { grpc: Code.Canceled, http: 499, envelope: 49901, meaning: "The caller went away before the answer; nothing was charged." },
  INTERNAL: { grpc: Code.Internal, http: 500, envelope: 50001, meaning: "Unexpected error; the request id is in the log." },
  UPSTREAM_FAILED: { grpc: Code.Unavailable, http: 502, envelope: 50201, meaning: "The upstream LLM or every search source failed." },
  NOT_CONFIGURED: { grpc: Code.FailedPrecondition, http: 503, envelope: 50301, meaning: "The upstream for this operation is not configured." },
  UNAVAILABLE: { grpc: Code.Unavailable, http: 503, envelope: 50302, meaning: "The database is unreachable; retry later." },
  MODEL_NOT_READY: { grpc: Code.Unavailable, http: 503, envelope: 50303, meaning: "The embedded model is downloading, loading or failed to; the message says which and what to set; wait Retry-After." },
  MODEL_BUSY: { grpc: Code.Unavailable, http: 503, envelope: 50304, meaning: "The embedded model cannot finish this call within the longest wait (or the caller's deadline); metadata holds the estimate; nothing was charged; wait Retry-After or ask fewer questions." },
} as const satisfies Record<string, { grpc: Code; http: number; envelope: number; meaning: string }>;

export type Reason = keyof typeof REASONS;

/**
 * Retry-After of a 503 UNAVAILABLE that names no delay of its own: the store
 * is restarting or failing over, which takes seconds, and an idempotent retry
 * after this answers exactly once.
 */
export const STORE_RETRY_AFTER_SECONDS = 1;

/** Reasons only the account area gives; the /api/v1 surface and its OpenAPI document never carry them. */
export const ACCOUNT_AREA_REASONS: ReadonlySet<Reason> = new Set<Reason>([
  "SIGNED_OUT",
  "SIGN_IN_FAILED",
  "SECOND_STEP_FAILED",
  "CROSS_SITE_REFUSED",
  "ROLE_FORBIDDEN",
  "LAST_OWNER",
  "TWO_FACTOR_REQUIRED",
  "INVITE_INVALID",
  "SIGN_IN_THROTTLED",
  "PASSWORD_CHECKS_BUSY",
  "KEY_LIMIT_REACHED",
  "EVALUATION_STATE",
]);

/**
 * Every reason the account area can answer with: its own, and those of the
 * request contract and the store it shares with the API. Never the
 * metering's (balance, limits, idempotency) nor the API key's.
 */
export const ACCOUNT_AREA_ANSWERS: ReadonlySet<Reason> = new Set<Reason>([
  ...ACCOUNT_AREA_REASONS,
  "INVALID_ARGUMENT",
  "MALFORMED_JSON",
  "NOT_FOUND",
  "METHOD_NOT_ALLOWED",
  "PAYLOAD_TOO_LARGE",
  "UNSUPPORTED_MEDIA_TYPE",
  "UNSUPPORTED_ENCODING",
  "CANCELLED",
  "INTERNAL",
  "UNAVAILABLE",
]);

export interface ApiErrorInit {
  field?: string;
  rule?: string;
  metadata?: Record<string, string>;
  cause?: unknown;
}

/** Builds the one kind of error the service throws: a ConnectError with a typed reason detail. */
export function apiError(reason: Reason, message: string, init: ApiErrorInit = {}): ConnectError {
  const detail = create(ErrorDetailSchema, {
    reason,
    field: init.field ?? "",
    rule: init.rule ?? "",
    metadata: init.metadata ?? {},
  });
  return new ConnectError(message, REASONS[reason].grpc, undefined, [{ desc: ErrorDetailSchema, value: detail }], init.cause);
}

/** The reason of a Connect error raised by connect itself rather than by our code. */
const reasonOfCode: Partial<Record<Code, Reason>> = {
  [Code.InvalidArgument]: "INVALID_ARGUMENT",
  [Code.Unauthenticated]: "UNAUTHENTICATED",
  [Code.ResourceExhausted]: "PAYLOAD_TOO_LARGE",
  [Code.Unimplemented]: "NOT_FOUND",
  [Code.NotFound]: "NOT_FOUND",
  [Code.Unavailable]: "UNAVAILABLE",
  [Code.Canceled]: "CANCELLED",
};

/** Reads the reason and detail of any thrown value; unknown errors are INTERNAL. */
export function describeError(err: unknown): { reason: Reason; detail: ErrorDetail; message: string } {
  if (err instanceof ConnectError) {
    const detail = err.findDetails(ErrorDetailSchema)[0];
    if (detail && detail.reason in REASONS) {
      return { reason: detail.reason as Reason, detail, message: err.rawMessage };
    }
    const reason = reasonOfCode[err.code];
    if (reason) {
      return { reason, detail: create(ErrorDetailSchema, { reason }), message: err.rawMessage };
    }
  }
  if (isDatabaseUnavailable(err)) {
    return { reason: "UNAVAILABLE", detail: create(ErrorDetailSchema, { reason: "UNAVAILABLE" }), message: "the database is unreachable; retry later" };
  }
  return { reason: "INTERNAL", detail: create(ErrorDetailSchema, { reason: "INTERNAL" }), message: "internal error" };
}

/**
 * Makes any thrown value safe to return: our own API errors pass through with
 * the request id added; anything else is replaced by a fixed INTERNAL error
 * whose cause keeps the original for the log.
 */
export function toPublicError(err: unknown, requestId: string): ConnectError {
  const { reason, detail, message } = describeError(err);
  if (reason === "INTERNAL") {
    return apiError("INTERNAL", `internal error (request id ${requestId})`, {
      metadata: { request_id: requestId },
      cause: err,
    });
  }
  const metadata =
    reason === "UNAVAILABLE" && detail.metadata["retry_after_seconds"] === undefined
      ? { ...detail.metadata, retry_after_seconds: String(STORE_RETRY_AFTER_SECONDS) }
      : detail.metadata;
  const withId = create(ErrorDetailSchema, { ...detail, metadata, requestId });
  const cause = err instanceof ConnectError ? err.cause : undefined;
  return new ConnectError(message, REASONS[reason].grpc, undefined, [{ desc: ErrorDetailSchema, value: withId }, ...standardDetails(withId)], cause);
}

/**
 * The same facts as google.rpc details, which generic gRPC tooling reads
 * without knowing our ErrorDetail: RetryInfo wherever a retry delay is known
 * (429, 503), BadRequest for a 4xx that names its field.
 */
function standardDetails(detail: ErrorDetail): { desc: DescMessage; value: Message }[] {
  const details: { desc: DescMessage; value: Message }[] = [];
  const retryMs = Number(detail.metadata["retry_after_ms"] ?? Number(detail.metadata["retry_after_seconds"] ?? NaN) * 1000);
  if (Number.isFinite(retryMs) && retryMs >= 0) {
    const retryDelay = create(DurationSchema, { seconds: BigInt(Math.floor(retryMs / 1000)), nanos: Math.round(retryMs % 1000) * 1_000_000 });
    details.push({ desc: RetryInfoSchema, value: create(RetryInfoSchema, { retryDelay }) });
  }
  if (detail.field !== "" && REASONS[detail.reason as Reason].http < 500) {
    const violation = { field: detail.field, description: detail.rule };
    details.push({ desc: BadRequestSchema, value: create(BadRequestSchema, { fieldViolations: [violation] }) });
  }
  return details;
}
