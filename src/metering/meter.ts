import crypto from "node:crypto";
import type { ConnectError } from "@connectrpc/connect";
import type { Knex } from "knex";
import { hashApiKey, isWellFormedApiKey, malformedApiKey } from "../keys/api-keys.js";
import type { MeteringConfig } from "../config.js";
import { apiError } from "../errors.js";
import type { Logger } from "../logger.js";
import { createBatcher } from "../db/statement-batcher.js";
import { isDatabaseUnavailable } from "../db/unavailable.js";
import { linkedSignal } from "../abort-signals.js";
import { isRefusal, refusalError } from "./admission-refusal.js";
import { billingOf, type Billing } from "./billing.js";
import { createHolds, type HoldStats } from "./holds.js";
import {
  abandon,
  admitMany,
  finishMany,
  settledFigures,
  sweep,
  type Admission,
  type AdmitInput,
  type Endpoint,
  type FinishResult,
  type FinishInput,
} from "./ledger.js";
import { rateLimitStateOf, type RateLimitState } from "./rate-limit-state.js";
import { createSweeper } from "./sweeper.js";

/** What the contract reserves per question of a decision: 32K input tokens, one unit each. */
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
export interface MeterStats extends HoldStats {
  /** Holds this replica has open right now (work running or being settled). */
  holdsInFlight: number;
  /** Holds released by lease expiry via this replica's sweeper. */
  holdsExpired: number;
  /**
   * Admissions abandoned before they reached the database (their reply was
   * late or lost and the abandon found nothing): should one still arrive, it
   * rolls itself back. Non-zero means admissions slower than the statement deadline.
   */
  admissionsAbandoned: number;
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
   * Waits between attempts of a finish (settle or release) when the database fails
   * (safe: a request finishes at most once). The default spans a PostgreSQL
   * restart of a few seconds.
   */
  settleRetryDelaysMs?: readonly number[];
}

/**
 * How the meter groups the admissions, and the settles and releases, of
 * concurrent calls (createBatcher): two statements of each kind out at a
 * time, and the calls arriving meanwhile go together in the next. One out
 * showed no steady difference in throughput, and with two a call waits less
 * often at a moderate load; four out was slower. A batch that has not answered
 * well past a usual batch's time gives its slot up, so a stalled reply holds
 * no one behind it (test/metering/lost-replies.test.ts). A batch stays small
 * because the account rows of its calls stay locked until it commits.
 */
export const METER_BATCHING = { maxBatch: 32, maxInFlight: 2, stallMs: 50 } as const;

/** The meter's admit and finish on `db`, batched as METER_BATCHING says (bench's PostgreSQL-alone row sends its pairs through them too). */
export function createBatchedLedger(db: Knex, timeoutMs: number | undefined) {
  return {
    admit: createBatcher<AdmitInput, Admission>({ run: (inputs) => admitMany(db, inputs, timeoutMs), ...METER_BATCHING }),
    finish: createBatcher<FinishInput, FinishResult>({ run: (inputs) => finishMany(db, inputs, timeoutMs), ...METER_BATCHING }),
  };
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;
const MAX_IDEMPOTENCY_KEY_LENGTH = 255;
const DEFAULT_RETRY_DELAYS_MS = [50, 200, 500, 1_000, 2_000];

/**
 * The single metering wrapper both services use, so reserve → settle /
 * release is written once. All state lives in PostgreSQL; the only process
 * state is the set of this replica's open holds, kept to release them on
 * shutdown.
 */
export function createMeter(deps: MeterDeps): Meter {
  const { db, config, logger } = deps;
  const now = (): Date | undefined => deps.now?.();
  const timeoutMs = config.statementTimeoutMs;
  const { admit, finish } = createBatchedLedger(db, timeoutMs);
  const abandonAlone = (input: FinishInput) => abandon(db, { ...input, timeoutMs });
  const holds = createHolds({ finish, retryDelaysMs: deps.settleRetryDelaysMs ?? DEFAULT_RETRY_DELAYS_MS, now });
  const sweeper = createSweeper(sweepNow, config.sweepIntervalMs, logger);
  let holdsExpired = 0;
  let admissionsAbandoned = 0;
  let closing = false;

  async function run<T>(call: MeteredCall, work: (signal: AbortSignal) => Promise<WorkResult<T>>): Promise<MeteredResult<T>> {
    if (closing) throw shuttingDown();
    checkCall(call);
    const admission = await admitCall(call);
    if (isRefusal(admission)) throw refusalError(admission);
    if (admission.outcome === "replay") {
      const asSettled = await replayedFigures(admission.requestId);
      return {
        kind: "replay",
        responseJson: admission.response,
        billing: billingOf(admission.requestId, admission.funding, admission.reservedUnits, admission.chargedUnits, asSettled ?? admission),
        rate: rateLimitStateOf(admission),
      };
    }

    const { requestId, funding, reservedUnits } = admission;
    const log = logger.child({ request_id: requestId, account_id: admission.accountId, endpoint: call.endpoint });
    holds.open(requestId);
    const result = await runWork(call, requestId, work, log);
    const response = call.idempotencyKey !== undefined ? (result.responseJson ?? null) : undefined;
    const settled = await holds.settle({ requestId, chargeUnits: result.chargeUnits, reservedUnits, response }, log);
    return {
      kind: "fresh",
      value: result.value,
      billing: billingOf(requestId, funding, reservedUnits, settled.chargedUnits, settled),
      rate: rateLimitStateOf(admission),
    };
  }

  /**
   * A replay answers what the original answered, whichever replica or release
   * served it: the account as the original's settle left it, when its entry
   * recorded that. A replay moves no money, so an unreachable database is a 503
   * that bills nothing.
   */
  async function replayedFigures(requestId: string) {
    try {
      return await settledFigures(db, requestId, timeoutMs);
    } catch (err) {
      if (!isDatabaseUnavailable(err)) throw err;
      throw apiError("UNAVAILABLE", "the database is unreachable; the call was not billed; retry later", { cause: err });
    }
  }

  /**
   * Admits the call in one round trip. When the database cannot be reached,
   * the hold may have committed with its reply lost, or may still commit: it
   * is given back now, not at its lease, and the call is answered 503.
   */
  async function admitCall(call: MeteredCall): Promise<Admission> {
    // The row id is chosen here, so an admission whose reply is lost can be found again.
    const rowId = UUID.test(call.requestId) ? call.requestId : crypto.randomUUID();
    try {
      return await admit({
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
      const abandoned = await holds.release(rowId, logger.child({ request_id: rowId, endpoint: call.endpoint }), abandonAlone);
      if (abandoned?.outcome === "not_found") admissionsAbandoned++;
      throw apiError("UNAVAILABLE", "the database is unreachable; the call was not billed; retry later", { cause: err });
    }
  }

  /** Runs the work under the call's deadline; any failure, or the caller leaving, releases the hold. */
  async function runWork<T>(
    call: MeteredCall,
    requestId: string,
    work: (signal: AbortSignal) => Promise<WorkResult<T>>,
    log: Logger,
  ): Promise<WorkResult<T>> {
    const workSignal = linkedSignal([call.signal], call.timeoutMs);
    try {
      const result = await work(workSignal.signal);
      if (call.signal.aborted) throw cancelled(call.signal);
      if (!Number.isSafeInteger(result.chargeUnits) || result.chargeUnits < 0) {
        throw new Error(`chargeUnits must be a non-negative integer, got ${result.chargeUnits}`);
      }
      return result;
    } catch (err) {
      await holds.release(requestId, log);
      // Work that failed because the caller left or the server is stopping says so, not "upstream failed".
      if (call.signal.aborted) throw closing ? shuttingDown() : cancelled(call.signal);
      throw err;
    } finally {
      workSignal.dispose();
    }
  }

  async function sweepNow(): Promise<number> {
    // A deadline like every money statement's: a reply lost on a connection that stays open would
    // otherwise stop this replica's sweeps for good and hang its shutdown, which waits for the sweep.
    const expired = await sweep(db, { now: now(), timeoutMs });
    if (expired > 0) {
      holdsExpired += expired;
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
      await holds.releaseAll(logger);
    },
    startSweeper: () => sweeper.start(),
    stop: () => sweeper.stop(),
    stats: () => ({ ...holds.stats(), holdsExpired, admissionsAbandoned, holdsInFlight: holds.openCount() }),
  };
}

/** Refuses, before anything is held, a call the meter cannot bill: a bad reservation, key or Idempotency-Key, or a caller already gone. */
function checkCall(call: MeteredCall): void {
  if (!Number.isSafeInteger(call.reserveUnits) || call.reserveUnits < 0) {
    throw new Error(`reserveUnits must be a non-negative integer, got ${call.reserveUnits}`);
  }
  if (!isWellFormedApiKey(call.apiKey)) {
    throw malformedApiKey();
  }
  if (call.idempotencyKey !== undefined && (call.idempotencyKey.length === 0 || call.idempotencyKey.length > MAX_IDEMPOTENCY_KEY_LENGTH)) {
    throw apiError("INVALID_ARGUMENT", `Idempotency-Key must be 1 to ${MAX_IDEMPOTENCY_KEY_LENGTH} characters`, {
      field: "idempotency_key",
      rule: "length",
    });
  }
  if (call.signal.aborted) throw cancelled(call.signal);
}

function cancelled(signal: AbortSignal): ConnectError {
  return apiError("CANCELLED", "the caller cancelled the call; nothing was charged", { cause: signal.reason });
}

function shuttingDown(): ConnectError {
  return apiError("UNAVAILABLE", "the server is shutting down; retry", { metadata: { retry_after_seconds: "1" } });
}
