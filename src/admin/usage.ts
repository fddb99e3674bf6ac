import type { Knex } from "knex";
import { listFinishedCalls } from "../metering/account-views.js";
import { unitsToCredits } from "../units.js";

/**
 * An account's most recent finished calls (settled, released, expired), newest
 * start first: the account area's usage view, as the operator's CLI prints it.
 */
export async function listUsage(db: Knex | Knex.Transaction, accountId: string, limit: number) {
  const { calls } = await listFinishedCalls(db, accountId, {}, { size: Math.min(Math.max(limit, 1), 1000) });
  return calls.map((call) => ({
    request_id: call.requestId,
    endpoint: call.endpoint,
    key_id: call.keyId,
    funding: call.funding,
    reserved_credits: unitsToCredits(call.reservedUnits),
    charged_credits: unitsToCredits(call.chargedUnits),
    status: call.status,
    started_at: call.startedAt,
    at: call.finishedAt,
  }));
}
