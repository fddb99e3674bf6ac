import { fromJson, toJson, type DescMessage, type JsonValue, type MessageShape } from "@bufbuild/protobuf";
import type { HandlerContext } from "@connectrpc/connect";
import { apiError } from "../errors.js";
import { callPhasesOf } from "../call/call-phases.js";
import { requestIdOf } from "../call/context.js";
import type { Billing } from "./billing.js";
import type { Meter } from "./meter.js";
import type { RateLimitState } from "./rate-limit-state.js";
import type { Endpoint } from "./ledger.js";

/** The billing block of both responses (`DecideResponse.billing`, `SearchResponse.cost`). */
export interface BillingInit {
  funding: string;
  reservedCredits: number;
  chargedCredits: number;
  balanceCredits: number;
  freeRequestsRemaining: number;
  requestId: string;
}

export interface MeteredRpcCall<O extends DescMessage> {
  /** The response schema: an Idempotency-Key replay returns the stored response through it. */
  schema: O;
  endpoint: Endpoint;
  /** From requireApiKey(ctx); admission authenticates it. */
  apiKey: string;
  /** The maximum cost in units. */
  reserveUnits: number;
  /** Deadline of the work; the hold's lease is this plus the configured margin. */
  timeoutMs: number;
  /** Canonical form of the request: the same Idempotency-Key with another request is a 422. Only computed for a call with a key. */
  fingerprint: () => string;
}

export interface MeteredWork<O extends DescMessage> {
  response: MessageShape<O>;
  /** Actual cost in units, charged up to the reservation. */
  chargeUnits: number;
}

/**
 * Runs one RPC under metering, the same way for gRPC, Connect and the JSON
 * gateway: authenticate and admit in one round trip, run the work, settle
 * before the answer leaves (or release on any failure). Decisions may use a
 * free request; search never does. Rate-limit state goes to response headers.
 */
export async function meteredRpc<O extends DescMessage>(
  meter: Meter,
  ctx: HandlerContext,
  call: MeteredRpcCall<O>,
  work: (signal: AbortSignal) => Promise<MeteredWork<O>>,
): Promise<{ response: MessageShape<O>; billing: BillingInit }> {
  const idempotencyKey = ctx.requestHeader.get("idempotency-key") ?? undefined;
  const phases = callPhasesOf(ctx);
  const started = performance.now();
  let workEnded: number | undefined;
  const result = await meter.run(
    {
      apiKey: call.apiKey,
      requestId: requestIdOf(ctx),
      endpoint: call.endpoint,
      reserveUnits: call.reserveUnits,
      freeAllowed: call.endpoint === "decide",
      timeoutMs: call.timeoutMs,
      signal: ctx.signal,
      idempotencyKey,
      requestFingerprint: idempotencyKey === undefined ? undefined : call.fingerprint(),
    },
    async (signal) => {
      const workStarted = performance.now();
      phases.admitMs = workStarted - started;
      try {
        const { response, chargeUnits } = await work(signal);
        return { value: response, chargeUnits, responseJson: idempotencyKey === undefined ? undefined : toJson(call.schema, response) };
      } finally {
        workEnded = performance.now();
        phases.upstreamMs = workEnded - workStarted;
      }
    },
  ).finally(() => {
    if (workEnded !== undefined) phases.finishMs = performance.now() - workEnded;
  });
  setRateLimitHeaders(ctx.responseHeader, result.rate);
  if (result.kind === "replay") {
    ctx.responseHeader.set("idempotent-replayed", "true");
    return { response: replayedResponse(call.schema, result.responseJson), billing: billingInit(result.billing) };
  }
  return { response: result.value, billing: billingInit(result.billing) };
}

/** IETF RateLimit header fields (draft-ietf-httpapi-ratelimit-headers) for the rolling minute. */
export function setRateLimitHeaders(headers: Headers, rate: RateLimitState): void {
  headers.set("ratelimit-limit", String(rate.limit));
  headers.set("ratelimit-remaining", String(rate.remaining));
  headers.set("ratelimit-reset", String(rate.resetSeconds));
}

function replayedResponse<O extends DescMessage>(schema: O, json: unknown): MessageShape<O> {
  try {
    return fromJson(schema, json as JsonValue, { ignoreUnknownFields: true });
  } catch (err) {
    throw apiError("INTERNAL", "internal error", { cause: err });
  }
}

function billingInit(billing: Billing): BillingInit {
  return {
    funding: billing.funding,
    reservedCredits: billing.reservedCredits,
    chargedCredits: billing.chargedCredits,
    balanceCredits: billing.balanceCredits,
    freeRequestsRemaining: billing.freeRequestsRemaining,
    requestId: billing.requestId,
  };
}
