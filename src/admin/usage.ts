import type { Knex } from "knex";
import { unitsToCredits } from "../units.js";

/** An account's most recently settled calls, newest settle first (the time shown), from the request records. */
export async function listUsage(db: Knex | Knex.Transaction, accountId: string, limit: number) {
  const rows = await db("requests")
    .select("id", "endpoint", "funding", "reserved", "charged", "created_at", "resolved_at")
    .where({ account_id: accountId, status: "settled" })
    .orderBy([{ column: "resolved_at", order: "desc" }, { column: "id", order: "desc" }])
    .limit(Math.min(Math.max(limit, 1), 1000));
  return rows.map((row) => ({
    request_id: row.id as string,
    endpoint: row.endpoint as string,
    funding: row.funding as string,
    reserved_credits: unitsToCredits(row.reserved as number),
    charged_credits: unitsToCredits(row.charged as number),
    at: row.resolved_at as Date,
  }));
}
