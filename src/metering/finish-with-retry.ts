import { setTimeout as delay } from "node:timers/promises";
import { isDatabaseUnavailable } from "../db/unavailable.js";
import type { FinishResult, FinishInput } from "./ledger.js";

/**
 * Settles or releases one hold, retrying after each of `retryDelaysMs` while
 * the database is unreachable. A request is finished (settled or released) only by its own call,
 * so a retry that finds it already in the state it asked for is looking at an
 * earlier attempt of its own that committed and lost its reply: that is this
 * call's outcome (asOwnOutcome), with the account figures that attempt left.
 */
export async function finishWithRetry(
  statement: (input: FinishInput) => Promise<FinishResult>,
  input: FinishInput,
  retryDelaysMs: readonly number[],
): Promise<FinishResult> {
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
 * A retried finish that finds its request already in the state it asked for
 * (settled for a success, released for a failure) reports it as done now.
 */
export function asOwnOutcome(resolution: FinishResult, input: FinishInput): FinishResult {
  const wanted = input.success ? "settled" : "released";
  if (resolution.outcome !== "not_active" || resolution.status !== wanted) return resolution;
  const { status: _status, ...rest } = resolution;
  return {
    ...rest,
    outcome: wanted,
    capped: input.success && rest.funding === "paid" && (input.actualUnits ?? 0) > rest.reservedUnits,
  };
}
