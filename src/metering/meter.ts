import crypto from "node:crypto";
import { setTimeout as delay } from "node:timers/promises";
import type { ConnectError } from "@connectrpc/connect";
import type { Knex } from "knex";
import { hashApiKey, isWellFormedApiKey } from "../accounts/api-keys.js";
import type { MeteringConfig } from "../config.js";
import { apiError } from "../errors.js";
import type { Logger } from "../logger.js";
import { createBatcher } from "../db/statement-batcher.js";
import { isDatabaseUnavailable } from "../db/unavailable.js";
import { linkedSignal } from "../signals.js";
import { unitsToCredits } from "../units.js";
import {
  abandon,
  admitMany,
  resolveMany,
  sweep,
  type AccountSnapshot,
  type Admission,
  type AdmitInput,
  type Endpoint,
  type Funding,
  type Resolution,
  type ResolveInput,
} from "./ledger.js";

/** Spec part 3: a decision reserves 32,000 units per question. */
export const DECISION_RESERVE_UNITS_PER_QUESTION = 32_000;

/** The reservation of a decision: its maximum cost. */
export function decisionReserveUnits(questionCount: number): number {
  return DECISION_RESERVE_UNITS_PER_QUESTION * questionCount;
}

/** The reservation of a search: the price of every source the request could query. */
export function searchReserveUnits(sources: readonly { priceUnits: number }[]): number {
  return sources.reduce((sum, source) => sum + source.priceUnits, 0);
}

export interface MeteredCall {
  /** A well-formed key (the caller checks isWellFormedApiKey; malformed keys are refused here too). */
  apiKey: string;
  /** The call's request id; used as the billing record's id when it is a UUID. */
  requestId: string;
  endpoint: Endpoint;
  /** Maximum cost in units (decisionReserveUnits / searchReserveUnits). */
  reserveUnits: number;
  /** True for decisions: a free request is used first when one is available. */
  freeAllowed: boolean;
  /**
   * How long the work may run, in ms from admission. The work's signal aborts
   * after it, and the hold's lease is this plus config.leaseMarginMs, so a
   * hold outlives its work unless the process stalls or dies.
   */
  timeoutMs: number;
  /** The caller's signal (client gone, shutdown). An abort releases the hold. */
  signal: AbortSignal;
  idempotencyKey?: string;
  /** A stable hash or canonical form of the request body: the same key with another body is a 422. */
  requestFingerprint?: string;
}

/** The billing block of a response. Credits are exact decimal views of integer units. */
export interface Billing {
  funding: Funding;
  reservedCredits: number;
  chargedCredits: number;
  /** Balance right after this call's own settle (not after later calls), also when a retry recognised the settle. */
  balanceCredits: number;
  /** Balance minus the holds of calls still in flight. */
  availableCredits: number;
  /** Free requests not used and not held. */
  freeRequestsRemaining: number;
  requestId: string;
}

/** For RateLimit-* headers: the rolling-minute limit. */
export interface RateLimitState {
  limit: number;
  remaining: number;
  /** Seconds until a slot frees (the oldest admission in the window leaves it). */
  resetSeconds: number;
}

/** What the work returns: its value, its actual cost and, for idempotent replay, the response body. */
export interface WorkResult<T> {
  value: T;
  /** Actual cost in units; charged up to the reservation. */
  chargeUnits: number;
  /** Stored when the call has an Idempotency-Key and returned as-is on a replay. */
  responseJson?: unknown;
}

export type MeteredResult<T> =
  | { kind: "fresh"; value: T; billing: Billing; rate: RateLimitState }
  | { kind: "replay"; responseJson: unknown; billing: Billing; rate: RateLimitState };

/** Counts of the events that should stay near zero; non-zero means stalls, crashes or DB trouble. */
export interface MeterStats {
  /** Holds this replica has open right now (work running or being settled). */
  holdsInFlight: number;
  /** Calls settled (charged their actual cost, or used their free request). */
  settles: number;
  /** Holds given back after a failed call, by this replica. */
  releases: number;
  /** Holds released by lease expiry via this replica's sweeper. */
  holdsExpired: number;
  /** Work finished after its hold had expired: answered as an error, not billed. */
  lateSettles: number;
  /** Settle could not be recorded: answered 503, the lease releases the hold. */
  settleFailures: number;
  /** Release could not be recorded: the lease releases the hold. */
  releaseFailures: number;
  /**
   * Admissions abandoned before they reached the database (their reply was
   * late or lost and the abandon found nothing): should one still arrive, it
   * rolls itself back. Non-zero means admissions slower than the statement deadline.
   */
  admissionsAbandoned: number;
  /** Actual cost above the reservation, charged at the reservation. */
  cappedCharges: number;
}

export interface Meter {
  /**
   * Meters one call: admit (or throw the API error for 401 / 429 / 402 / 409 /
   * 422 with its metadata), run the work, then settle before returning, so no
   * answer leaves without a settlement record. Any failure after admission
   * (work throws, caller aborts, settle refused) releases the hold and throws.
   * A settled Idempotency-Key replays the stored response without running the work.
   */
  run<T>(call: MeteredCall, work: (signal: AbortSignal) => Promise<WorkResult<T>>): Promise<MeteredResult<T>>;
  /** Shutdown begins: new calls are refused (UNAVAILABLE); calls in flight go on. */
  beginShutdown(): void;
  /** Graceful shutdown: refuses new calls, waits for releases under way, and releases every hold this process still has. */
  releaseAll(): Promise<void>;
  /** Expires every hold whose lease has passed, now (what the sweeper runs); returns how many. */
  sweepNow(): Promise<number>;
  /** Starts this replica's periodic sweep of expired holds (every config.sweepIntervalMs). */
  startSweeper(): void;
  /** Stops the sweeper and waits for a sweep in progress. */
  stop(): Promise<void>;
  stats(): MeterStats;
}

export interface MeterDeps {
  db: Knex;
  config: MeteringConfig;
  logger: Logger;
  /** Test clock passed to the database functions; the database clock when absent. */
  now?: () => Date;
  /**
   * Waits between attempts of a settle or release when the database fails
   * (safe: a request resolves at most once). The default spans a PostgreSQL
   * restart of a few seconds.
   */
  settleRetryDelaysMs?: readonly number[];
}

/**
 * How the meter groups the admissions, and the settles and releases, of
 * concurrent calls (createBatcher): two statements of each kind out at a
 * time, and the calls arriving meanwhile go together in the next. One out
 * instead gave 1,604, 1,397 and 1,263 decisions/s against two's 1,286, 1,479
 * and 1,338 (bench:ab, three alternated sets): no steady difference, and with
 * two a call waits less often at a moderate load. Four out gave 1,091 against
 * 1,232. A batch that has not answered in 50 ms, many times a usual batch's
 * time, gives its slot up, so a stalled reply holds no one behind it
 * (test/metering/lost-replies.test.ts). At most 32 calls in one, whose
 * account rows stay locked until it commits.
 */
export const METER_BATCHING = { maxBatch: 32, maxInFlight: 2, stallMs: 50 } as const;

/** The meter's admit and resolve on `db`, batched as METER_BATCHING says (bench's PostgreSQL-alone row sends its pairs through them too). */
export function createBatchedLedger(db: Knex, timeoutMs: number | undefined) {
  return {
    admit: createBatcher<AdmitInput, Admission>({ run: (inputs) => admitMany(db, inputs, timeoutMs), ...METER_BATCHING }),
    resolve: createBatcher<ResolveInput, Resolution>({ run: (inputs) => resolveMany(db, inputs, timeoutMs), ...METER_BATCHING }),
  };
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const MAX_IDEMPOTENCY_KEY_LENGTH = 255;

/**
 * The single metering wrapper both services use, so reserve → settle /
 * release is written once. All state lives in PostgreSQL; the only process
 * state is the set of this replica's open holds, kept to release them on
 * shutdown.
 */
export function createMeter(deps: MeterDeps): Meter {
  const { db, config, logger } = deps;
  const now = (): Date | undefined => deps.now?.();
  const retryDelaysMs = deps.settleRetryDelaysMs ?? [50, 200, 500, 1_000, 2_000];
  const timeoutMs = config.statementTimeoutMs;
  const { admit, resolve } = createBatchedLedger(db, timeoutMs);
  const abandonAlone = (input: ResolveInput) => abandon(db, { ...input, timeoutMs });
  const held = new Set<string>();
  /** Releases under way, so shutdown can wait for them before the pool closes. */
  const releasing = new Set<Promise<unknown>>();
  const counters: Omit<MeterStats, "holdsInFlight"> = { settles: 0, releases: 0, holdsExpired: 0, lateSettles: 0, settleFailures: 0, releaseFailures: 0, admissionsAbandoned: 0, cappedCharges: 0 };
  let closing = false;
  let sweeper: NodeJS.Timeout | undefined;
  let sweeping: Promise<void> | undefined;

  /**
   * Settles or releases one hold, retrying while the database is unreachable.
   * A request is resolved only by its own call, so a retry that finds it
   * already in the state it asked for is looking at an earlier attempt of its
   * own that committed and lost its reply: that is this call's outcome.
   */
  async function resolveWithRetry(input: ResolveInput, statement = resolve): Promise<Resolution> {
    for (let attempt = 0; ; attempt++) {
      try {
        const resolution = await statement(input);
        return attempt === 0 ? resolution : asOwnOutcome(resolution, input);
      } catch (err) {
        const wait = retryDelaysMs[attempt];
        if (wait === undefined || !isDatabaseUnavailable(err)) throw err;
        await delay(wait);
      }
    }
  }

  /**
   * Gives a hold back; `abandon` when the admission's own outcome is unknown
   * (ledger.abandon). Resolves to what the database answered, or undefined
   * when it could not be reached (the lease releases the hold).
   */
  function release(requestId: string, log: Logger, statement = resolve): Promise<Resolution | undefined> {
    const pending = (async () => {
      try {
        const released = await resolveWithRetry({ requestId, success: false, now: now() }, statement);
        if (released.outcome === "released") counters.releases++;
        return released;
      } catch (err) {
        counters.releaseFailures++;
        log.warn("release failed; the lease will release the hold", { err });
        return undefined;
      } finally {
        held.delete(requestId);
      }
    })();
    releasing.add(pending);
    return pending.finally(() => releasing.delete(pending));
  }

  async function run<T>(call: MeteredCall, work: (signal: AbortSignal) => Promise<WorkResult<T>>): Promise<MeteredResult<T>> {
    if (closing) throw shuttingDown();
    if (!Number.isSafeInteger(call.reserveUnits) || call.reserveUnits < 0) {
      throw new Error(`reserveUnits must be a non-negative integer, got ${call.reserveUnits}`);
    }
    if (!isWellFormedApiKey(call.apiKey)) {
      throw apiError("UNAUTHENTICATED", "malformed API key: expected Authorization: Bearer ts_live_...");
    }
    if (call.idempotencyKey !== undefined && (call.idempotencyKey.length === 0 || call.idempotencyKey.length > MAX_IDEMPOTENCY_KEY_LENGTH)) {
      throw apiError("INVALID_ARGUMENT", `Idempotency-Key must be 1 to ${MAX_IDEMPOTENCY_KEY_LENGTH} characters`, {
        field: "idempotency_key",
        rule: "length",
      });
    }
    if (call.signal.aborted) throw cancelled(call.signal);

    // The row id is chosen here, so an admission whose reply is lost can be found again.
    const rowId = UUID.test(call.requestId) ? call.requestId : crypto.randomUUID();
    let admission;
    try {
      admission = await admit({
        keyHash: hashApiKey(call.apiKey),
        endpoint: call.endpoint,
        reserveUnits: call.reserveUnits,
        // The ledger funds only decisions from free requests, whatever the caller allows.
        freeAllowed: call.freeAllowed,
        leaseMs: call.timeoutMs + config.leaseMarginMs,
        idempotencyKey: call.idempotencyKey,
        requestHash:
          call.idempotencyKey !== undefined && call.requestFingerprint !== undefined
            ? crypto.createHash("sha256").update(call.requestFingerprint).digest()
            : undefined,
        requestId: rowId,
        now: now(),
      });
    } catch (err) {
      if (!isDatabaseUnavailable(err)) throw err;
      // The hold may have committed with its reply lost, or may still commit: give it back now, not at its lease.
      const abandoned = await release(rowId, logger.child({ request_id: rowId, endpoint: call.endpoint }), abandonAlone);
      if (abandoned?.outcome === "not_found") counters.admissionsAbandoned++;
      throw apiError("UNAVAILABLE", "the database is unreachable; the call was not billed; retry later", { cause: err });
    }

    switch (admission.outcome) {
      case "unauthenticated":
        throw apiError("UNAUTHENTICATED", "invalid API key: unknown or revoked");
      case "rate_limited": {
        const seconds = ceilSeconds(admission.retryAfterMs);
        throw apiError("RATE_LIMITED", `rate limit: at most ${admission.rateLimit} calls per rolling minute; retry in ${seconds} s`, {
          metadata: {
            limit: "requests_per_minute",
            limit_value: String(admission.rateLimit),
            retry_after_seconds: String(seconds),
            retry_after_ms: String(admission.retryAfterMs),
            ...rateMetadata(admission),
          },
        });
      }
      case "concurrency_limited": {
        const seconds = ceilSeconds(admission.retryAfterMs);
        throw apiError("CONCURRENCY_LIMITED", `concurrency limit: at most ${admission.maxInFlight} calls in flight; retry in ${seconds} s`, {
          metadata: {
            limit: "concurrent_requests",
            limit_value: String(admission.maxInFlight),
            retry_after_seconds: String(seconds),
            retry_after_ms: String(admission.retryAfterMs),
            ...rateMetadata(admission),
          },
        });
      }
      case "insufficient_balance":
        throw apiError(
          "INSUFFICIENT_BALANCE",
          `insufficient balance: this call reserves ${unitsToCredits(admission.requiredUnits)} credits, ${unitsToCredits(admission.availableUnits)} available`,
          {
            metadata: {
              required_credits: String(unitsToCredits(admission.requiredUnits)),
              available_credits: String(unitsToCredits(admission.availableUnits)),
              required_units: String(admission.requiredUnits),
              available_units: String(admission.availableUnits),
              free_requests_remaining: String(admission.freeAvailable),
              ...rateMetadata(admission),
            },
          },
        );
      case "idempotency_in_progress":
        throw apiError("IDEMPOTENCY_IN_PROGRESS", "a request with this Idempotency-Key is still in flight; retry after it completes", {
          field: "idempotency_key",
          rule: "one call at a time per key",
          metadata: { original_request_id: admission.requestId, ...rateMetadata(admission) },
        });
      case "idempotency_mismatch":
        throw apiError("IDEMPOTENCY_MISMATCH", "this Idempotency-Key was used with a different request", {
          field: "idempotency_key",
          rule: "a key stands for one request body",
          metadata: { original_request_id: admission.requestId, ...rateMetadata(admission) },
        });
      case "replay":
        return {
          kind: "replay",
          responseJson: admission.response,
          billing: billingOf(admission.requestId, admission.funding, admission.reservedUnits, admission.chargedUnits, admission),
          rate: rateOf(admission),
        };
      case "admitted":
        break;
    }

    const { requestId, funding, reservedUnits } = admission;
    const rate = rateOf(admission);
    const log = logger.child({ request_id: requestId, account_id: admission.accountId, endpoint: call.endpoint });
    held.add(requestId);

    const workSignal = linkedSignal([call.signal], call.timeoutMs);
    let result: WorkResult<T>;
    try {
      result = await work(workSignal.signal);
      if (call.signal.aborted) throw cancelled(call.signal);
      if (!Number.isSafeInteger(result.chargeUnits) || result.chargeUnits < 0) {
        throw new Error(`chargeUnits must be a non-negative integer, got ${result.chargeUnits}`);
      }
    } catch (err) {
      await release(requestId, log);
      // Work that failed because the caller left or the server is stopping says so, not "upstream failed".
      if (call.signal.aborted) throw closing ? shuttingDown() : cancelled(call.signal);
      throw err;
    } finally {
      workSignal.dispose();
    }

    let settled: Resolution;
    try {
      settled = await resolveWithRetry({
        requestId,
        success: true,
        actualUnits: result.chargeUnits,
        response: call.idempotencyKey !== undefined ? (result.responseJson ?? null) : undefined,
        now: now(),
      });
    } catch (err) {
      settled = await settleOrReleaseAfterFailure(requestId, result.chargeUnits, err, log);
    } finally {
      held.delete(requestId);
    }

    if (settled.outcome !== "settled") {
      counters.lateSettles++;
      log.warn("late settle: the hold was no longer active; answer withheld", {
        outcome: settled.outcome,
        status: settled.outcome === "not_active" ? settled.status : undefined,
      });
      throw apiError("UNAVAILABLE", "the call outlived its reservation and was not billed; retry");
    }
    counters.settles++;
    if (settled.capped) {
      counters.cappedCharges++;
      log.warn("actual cost above the reservation; charged the reservation", {
        actual_units: result.chargeUnits,
        reserved_units: reservedUnits,
      });
    }
    return {
      kind: "fresh",
      value: result.value,
      billing: billingOf(requestId, funding, reservedUnits, settled.chargedUnits, settled),
      rate,
    };
  }

  /**
   * The settle kept failing. Releasing tells what happened: either the hold is
   * given back (answer 503, not billed) or one of the settle's attempts had
   * committed after all (answer 200 with that billing). When the release
   * fails too, nobody knows, and the 503 says so.
   */
  async function settleOrReleaseAfterFailure(requestId: string, chargeUnits: number, settleError: unknown, log: Logger): Promise<Resolution> {
    counters.settleFailures++;
    let fallback: Resolution;
    try {
      fallback = await resolveWithRetry({ requestId, success: false, now: now() });
    } catch (err) {
      counters.releaseFailures++;
      log.error("settle and release failed; the lease releases the hold unless a settle attempt committed", { err: settleError });
      throw apiError(
        "UNAVAILABLE",
        "the database is unreachable and this call's billing could not be confirmed; a retry with the same Idempotency-Key returns the answer if it was billed",
        { cause: err, metadata: { billing: "unknown" } },
      );
    }
    if (fallback.outcome === "not_active" && fallback.status === "settled") {
      log.warn("a settle attempt had committed though its reply was lost; answering with its billing");
      return asOwnOutcome(fallback, { requestId, success: true, actualUnits: chargeUnits });
    }
    if (fallback.outcome === "released") counters.releases++;
    log.warn("settle failed; the hold was released and the call is answered 503", { err: settleError });
    throw apiError("UNAVAILABLE", "the call could not be billed because the database is unreachable; it was not billed; retry later", {
      cause: settleError,
    });
  }

  async function sweepNow(): Promise<number> {
    // A deadline like every money statement's: a reply lost on a connection that stays open would
    // otherwise stop this replica's sweeps for good and hang its shutdown, which waits for the sweep.
    const expired = await sweep(db, { now: now(), timeoutMs });
    if (expired > 0) {
      counters.holdsExpired += expired;
      logger.warn("released expired holds", { expired });
    }
    return expired;
  }

  return {
    run,
    sweepNow,
    beginShutdown() {
      closing = true;
    },
    async releaseAll() {
      closing = true;
      await Promise.all([...releasing]);
      await Promise.all([...held].map((id) => release(id, logger.child({ request_id: id }))));
    },
    startSweeper() {
      if (sweeper) return;
      sweeper = setInterval(() => {
        if (sweeping) return;
        sweeping = sweepNow()
          .then(() => undefined, (err: unknown) => logger.warn("sweep failed", { err }))
          .finally(() => {
            sweeping = undefined;
          });
      }, config.sweepIntervalMs);
      sweeper.unref();
    },
    async stop() {
      if (sweeper) clearInterval(sweeper);
      sweeper = undefined;
      await sweeping;
    },
    stats: () => ({ ...counters, holdsInFlight: held.size }),
  };
}

/**
 * A retried resolve that finds its request already in the state it asked for
 * (settled for a success, released for a failure) reports it as done now.
 */
function asOwnOutcome(resolution: Resolution, input: ResolveInput): Resolution {
  const wanted = input.success ? "settled" : "released";
  if (resolution.outcome !== "not_active" || resolution.status !== wanted) return resolution;
  const { status: _status, ...rest } = resolution;
  return {
    ...rest,
    outcome: wanted,
    capped: input.success && rest.funding === "paid" && (input.actualUnits ?? 0) > rest.reservedUnits,
  };
}

function billingOf(
  requestId: string,
  funding: Funding,
  reservedUnits: number,
  chargedUnits: number,
  account: { balanceUnits: number; availableUnits: number; freeAvailable: number },
): Billing {
  return {
    funding,
    reservedCredits: unitsToCredits(reservedUnits),
    chargedCredits: unitsToCredits(chargedUnits),
    balanceCredits: unitsToCredits(account.balanceUnits),
    availableCredits: unitsToCredits(account.availableUnits),
    freeRequestsRemaining: account.freeAvailable,
    requestId,
  };
}

function rateOf(account: AccountSnapshot): RateLimitState {
  return { limit: account.rateLimit, remaining: account.rateRemaining, resetSeconds: ceilSeconds(account.rateResetMs) };
}

/** The rate-limit state for headers on an error response (the gateway reads these keys). */
function rateMetadata(account: AccountSnapshot): Record<string, string> {
  const rate = rateOf(account);
  return {
    ratelimit_limit: String(rate.limit),
    ratelimit_remaining: String(rate.remaining),
    ratelimit_reset_seconds: String(rate.resetSeconds),
  };
}

function ceilSeconds(ms: number): number {
  return Math.ceil(ms / 1000);
}

function cancelled(signal: AbortSignal): ConnectError {
  return apiError("CANCELLED", "the caller cancelled the call; nothing was charged", { cause: signal.reason });
}

function shuttingDown(): ConnectError {
  return apiError("UNAVAILABLE", "the server is shutting down; retry", { metadata: { retry_after_seconds: "1" } });
}
