import { apiError } from "../errors.js";
import type { Logger } from "../logger.js";
import type { FinishResult, FinishInput } from "./ledger.js";
import { asOwnOutcome, finishWithRetry } from "./finish-with-retry.js";

/** How this replica's holds ended; each but `settles` should stay near zero. */
export interface HoldStats {
  /** Calls settled (charged their actual cost, or used their free request). */
  settles: number;
  /** Holds given back after a failed call, by this replica. */
  releases: number;
  /** Work finished after its hold had expired: answered as an error, not billed. */
  lateSettles: number;
  /** Settle could not be recorded: answered 503, the lease releases the hold. */
  settleFailures: number;
  /** Release could not be recorded: the lease releases the hold. */
  releaseFailures: number;
  /** Actual cost above the reservation, charged at the reservation. */
  cappedCharges: number;
}

/** A settle this call's own attempt recorded: the charge and the account as it left it. */
export type Settled = Extract<FinishResult, { capped: boolean }>;

/** What a settle charges and stores. */
export interface SettleInput {
  requestId: string;
  /** The work's actual cost in units; charged up to the reservation. */
  chargeUnits: number;
  /** The reservation, for the log line of a capped charge. */
  reservedUnits: number;
  /** Stored for an idempotent replay; undefined when the call has no Idempotency-Key. */
  response: unknown;
}

/** The holds this replica opened, and the two ways each ends: settled or released. */
export interface Holds {
  /** Records a hold the database admitted, so shutdown can give it back. */
  open(requestId: string): void;
  /**
   * Charges the work's cost before the answer leaves. Only a settle that this
   * call recorded is returned; a hold that was gone (its lease passed), a
   * settle that could not be recorded, or one whose outcome nobody knows is
   * thrown as UNAVAILABLE and bills nothing that the answer does not say.
   */
  settle(input: SettleInput, log: Logger): Promise<Settled>;
  /**
   * Gives a hold back; `statement` is ledger.abandon when the admission's own
   * outcome is unknown. Resolves to what the database answered, or undefined
   * when it could not be reached (the lease releases the hold).
   */
  release(requestId: string, log: Logger, statement?: (input: FinishInput) => Promise<FinishResult>): Promise<FinishResult | undefined>;
  /** Waits for releases under way, then releases every hold still open. */
  releaseAll(logger: Logger): Promise<void>;
  /** How many holds are open now. */
  openCount(): number;
  stats(): HoldStats;
}

export interface HoldsDeps {
  /** The settle and release statement (batched). */
  finish: (input: FinishInput) => Promise<FinishResult>;
  /** Waits between attempts while the database is unreachable. */
  retryDelaysMs: readonly number[];
  /** Test clock passed to the database; undefined for the database clock. */
  now: () => Date | undefined;
}

/** This replica's open holds and their settles and releases, with retries and counters. */
export function createHolds({ finish, retryDelaysMs, now }: HoldsDeps): Holds {
  const open = new Set<string>();
  /** Releases under way, so shutdown can wait for them before the pool closes. */
  const releasing = new Set<Promise<unknown>>();
  const counters: HoldStats = { settles: 0, releases: 0, lateSettles: 0, settleFailures: 0, releaseFailures: 0, cappedCharges: 0 };

  function release(requestId: string, log: Logger, statement = finish): Promise<FinishResult | undefined> {
    const pending = (async () => {
      try {
        const released = await finishWithRetry(statement, { requestId, success: false, now: now() }, retryDelaysMs);
        if (released.outcome === "released") counters.releases++;
        return released;
      } catch (err) {
        counters.releaseFailures++;
        log.warn("release failed; the lease will release the hold", { err });
        return undefined;
      } finally {
        open.delete(requestId);
      }
    })();
    releasing.add(pending);
    return pending.finally(() => releasing.delete(pending));
  }

  async function settle(input: SettleInput, log: Logger): Promise<Settled> {
    const { requestId, chargeUnits } = input;
    let settled: FinishResult;
    try {
      settled = await finishWithRetry(
        finish,
        { requestId, success: true, actualUnits: chargeUnits, response: input.response, now: now() },
        retryDelaysMs,
      );
    } catch (err) {
      settled = await settleOrReleaseAfterFailure(requestId, chargeUnits, err, log);
    } finally {
      open.delete(requestId);
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
        actual_units: chargeUnits,
        reserved_units: input.reservedUnits,
      });
    }
    return settled;
  }

  /**
   * The settle kept failing. Releasing tells what happened: either the hold is
   * given back (answer 503, not billed) or one of the settle's attempts had
   * committed after all (answer 200 with that billing). When the release
   * fails too, nobody knows, and the 503 says so.
   */
  async function settleOrReleaseAfterFailure(requestId: string, chargeUnits: number, settleError: unknown, log: Logger): Promise<FinishResult> {
    counters.settleFailures++;
    let fallback: FinishResult;
    try {
      fallback = await finishWithRetry(finish, { requestId, success: false, now: now() }, retryDelaysMs);
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

  return {
    open: (requestId) => void open.add(requestId),
    settle,
    release,
    async releaseAll(logger) {
      await Promise.all([...releasing]);
      await Promise.all([...open].map((id) => release(id, logger.child({ request_id: id }))));
    },
    openCount: () => open.size,
    stats: () => ({ ...counters }),
  };
}
