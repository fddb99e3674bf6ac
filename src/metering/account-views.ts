import type { Knex } from "knex";
import type { Endpoint, Funding } from "./ledger.js";
import { floorDay, floorHour, readRolledUntil } from "./usage-rollup.js";

/**
 * What the account area and the operator's CLI read of an account's money
 * and calls. Read-only: money is written by the ledger's functions alone.
 * Every query names the account, so a caller can only ever read its own.
 */

/** The widest range GetUsageSummary counts, per granularity (a bound on the buckets one call returns). */
export const MAX_SUMMARY_DAYS = { day: 400, hour: 31 } as const;

/** An account's money and limits as they stand, in integer units. */
export interface AccountMoney {
  id: string;
  name: string;
  balanceUnits: number;
  heldUnits: number;
  /** What new calls may reserve: the balance less what calls in flight hold. */
  availableUnits: number;
  freeRemaining: number;
  freeHeld: number;
  /** Free requests not held by calls in flight. */
  freeAvailable: number;
  inFlight: number;
  maxInFlight: number;
  /** Calls allowed per rate window (per minute with the default window). */
  rateLimit: number;
  rateWindowMs: number;
  /** The rate limit as calls per minute, whatever the window. */
  requestsPerMinute: number;
  createdAt: Date;
}

export async function readAccountMoney(db: Knex | Knex.Transaction, accountId: string): Promise<AccountMoney | undefined> {
  const row = await db("accounts")
    .select("id", "name", "balance", "reserved", "free_remaining", "free_reserved", "in_flight", "max_in_flight", "rate_limit", "rate_window_ms", "created_at")
    .where({ id: accountId })
    .first();
  if (!row) return undefined;
  const balanceUnits = Number(row.balance);
  const heldUnits = Number(row.reserved);
  const freeRemaining = Number(row.free_remaining);
  const freeHeld = Number(row.free_reserved);
  const rateLimit = Number(row.rate_limit);
  const rateWindowMs = Number(row.rate_window_ms);
  return {
    id: row.id,
    name: row.name,
    balanceUnits,
    heldUnits,
    availableUnits: balanceUnits - heldUnits,
    freeRemaining,
    freeHeld,
    freeAvailable: freeRemaining - freeHeld,
    inFlight: Number(row.in_flight),
    maxInFlight: Number(row.max_in_flight),
    rateLimit,
    rateWindowMs,
    requestsPerMinute: Math.round((rateLimit * 60_000) / rateWindowMs),
    createdAt: row.created_at,
  };
}

/** The statuses of a finished call. */
export const FINISHED_STATUSES = ["settled", "released", "expired"] as const;
export type FinishedStatus = (typeof FINISHED_STATUSES)[number];

/** One finished call of an account. */
export interface FinishedCall {
  requestId: string;
  endpoint: Endpoint;
  /** Empty for calls admitted before keys were recorded on them. */
  keyId: string;
  /** The evaluation whose example this call was; empty for the API's calls. */
  evaluationId: string;
  funding: Funding;
  reservedUnits: number;
  chargedUnits: number;
  status: FinishedStatus;
  startedAt: Date;
  finishedAt: Date;
}

/** Which finished calls to list: an endpoint (or both), a start-time range, a page. */
export interface CallFilter {
  endpoint?: Endpoint;
  /** Only the calls of this key. */
  keyId?: string;
  /** Started at or after. */
  since?: Date;
  /** Started before. */
  until?: Date;
}

/** Where a page of calls starts: after this call (exclusive), newest first. */
export interface CallCursor {
  startedAt: Date;
  requestId: string;
}

/** A page of the account's finished calls, newest start first, and whether more follow. */
export async function listFinishedCalls(
  db: Knex | Knex.Transaction,
  accountId: string,
  filter: CallFilter,
  page: { size: number; after?: CallCursor },
): Promise<{ calls: FinishedCall[]; more: boolean }> {
  const query = db("requests")
    .select("id", "endpoint", "key_id", "evaluation_id", "funding", "reserved", "charged", "status", "created_at", "resolved_at")
    .where({ account_id: accountId })
    .whereIn("status", FINISHED_STATUSES as unknown as string[]);
  applyFilter(query, filter);
  if (page.after) {
    // The plain bound lets the (account_id, created_at) index start at the cursor; the row comparison breaks ties.
    query.where("created_at", "<=", page.after.startedAt).whereRaw("(created_at, id) < (?, ?)", [page.after.startedAt, page.after.requestId]);
  }
  const rows = await query.orderBy([{ column: "created_at", order: "desc" }, { column: "id", order: "desc" }]).limit(page.size + 1);
  const calls = rows.slice(0, page.size).map(
    (row): FinishedCall => ({
      requestId: row.id,
      endpoint: row.endpoint,
      keyId: row.key_id ?? "",
      evaluationId: row.evaluation_id ?? "",
      funding: row.funding,
      reservedUnits: Number(row.reserved),
      chargedUnits: Number(row.charged),
      status: row.status,
      startedAt: row.created_at,
      finishedAt: row.resolved_at ?? row.created_at,
    }),
  );
  return { calls, more: rows.length > page.size };
}

/** Calls and charged units of one period and endpoint (and key, when grouped by key). */
export interface UsageBucketRow {
  start: Date;
  endpoint: Endpoint;
  /** Empty unless grouped by key. */
  keyId: string;
  calls: number;
  chargedUnits: number;
}

/** What a usage summary counts: a start-time range, per day or hour (UTC), of one key or all, grouped by key or not. */
export interface SummaryRange {
  since: Date;
  until: Date;
  granularity: "day" | "hour";
  keyId?: string;
  byKey?: boolean;
}

/**
 * The account's finished calls counted per day or hour (UTC) and endpoint
 * (and key), oldest first; of one key when asked. What the roll-up has
 * counted is read from it: whole days from usage_daily (per day), whole
 * hours from usage_hourly; the partial hours at either end and every hour
 * from its watermark on are counted from the calls themselves, so the
 * answer is the same as counting every call.
 */
export async function summarizeCalls(db: Knex | Knex.Transaction, accountId: string, range: SummaryRange): Promise<UsageBucketRow[]> {
  const rolledUntil = await readRolledUntil(db);
  const firstHour = ceilHour(range.since);
  const lastHour = floorHour(range.until);
  const rolledEnd = rolledUntil && rolledUntil < lastHour ? rolledUntil : lastHour;
  if (!rolledUntil || firstHour >= rolledEnd) return summarizeCallsFromRequests(db, accountId, range);
  let days = { from: rolledEnd, to: rolledEnd };
  if (range.granularity === "day") {
    const firstDay = ceilDay(firstHour);
    const lastDay = floorDay(rolledEnd);
    if (firstDay < lastDay) days = { from: firstDay, to: lastDay };
  }
  return countWithRollup(db, accountId, range, { from: firstHour, to: rolledEnd }, days);
}

/** The same summary counted from every call, without the roll-up: the reference the roll-up must equal. */
export async function summarizeCallsFromRequests(db: Knex | Knex.Transaction, accountId: string, range: SummaryRange): Promise<UsageBucketRow[]> {
  const keyColumn = range.byKey ? "coalesce(key_id::text, '')" : "''";
  const result = await db.raw(
    `SELECT date_trunc(:unit, created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS start, endpoint, ${keyColumn} AS key_id,
            count(*)::integer AS calls, coalesce(sum(charged), 0)::bigint AS charged
       FROM requests
      WHERE account_id = :accountId AND status IN ('settled', 'released', 'expired')
        AND created_at >= :since AND created_at < :until
        AND (:keyId::uuid IS NULL OR key_id = :keyId::uuid)
      GROUP BY 1, 2, 3
      ORDER BY 1, 2, 3`,
    { unit: range.granularity, accountId, since: range.since, until: range.until, keyId: range.keyId ?? null },
  );
  return bucketRows(result.rows);
}

/**
 * Counts [since, until): the whole days of `days` from usage_daily, the rest
 * of `rolled` from usage_hourly, the partial hours around it from requests.
 */
async function countWithRollup(
  db: Knex | Knex.Transaction,
  accountId: string,
  range: SummaryRange,
  rolled: { from: Date; to: Date },
  days: { from: Date; to: Date },
): Promise<UsageBucketRow[]> {
  const keyColumn = range.byKey ? "coalesce(key_id::text, '')" : "''";
  const result = await db.raw(
    `WITH hours AS (
       SELECT date_trunc('hour', created_at AT TIME ZONE 'UTC') AS hour, endpoint::text AS endpoint, ${keyColumn} AS key_id,
              count(*)::bigint AS calls, coalesce(sum(charged), 0)::bigint AS charged
         FROM requests
        WHERE account_id = :accountId AND status IN ('settled', 'released', 'expired')
          AND ((created_at >= :since AND created_at < :rolledFrom) OR (created_at >= :rolledTo AND created_at < :until))
          AND (:keyId::uuid IS NULL OR key_id = :keyId::uuid)
        GROUP BY 1, 2, 3
       UNION ALL
       SELECT hour AT TIME ZONE 'UTC', endpoint, ${keyColumn}, calls, charged
         FROM usage_hourly
        WHERE account_id = :accountId AND ((hour >= :rolledFrom AND hour < :daysFrom) OR (hour >= :daysTo AND hour < :rolledTo))
          AND (:keyId::uuid IS NULL OR key_id = :keyId::uuid)
       UNION ALL
       SELECT day AT TIME ZONE 'UTC', endpoint, ${keyColumn}, calls, charged
         FROM usage_daily
        WHERE account_id = :accountId AND day >= :daysFrom AND day < :daysTo
          AND (:keyId::uuid IS NULL OR key_id = :keyId::uuid)
     )
     SELECT date_trunc(:unit, hour) AT TIME ZONE 'UTC' AS start, endpoint, key_id,
            sum(calls)::bigint AS calls, sum(charged)::bigint AS charged
       FROM hours
      GROUP BY 1, 2, 3
      ORDER BY 1, 2, 3`,
    {
      unit: range.granularity,
      accountId,
      since: range.since,
      until: range.until,
      rolledFrom: rolled.from,
      rolledTo: rolled.to,
      daysFrom: days.from,
      daysTo: days.to,
      keyId: range.keyId ?? null,
    },
  );
  return bucketRows(result.rows);
}

function bucketRows(rows: { start: Date; endpoint: Endpoint; key_id: string; calls: number | string; charged: string }[]): UsageBucketRow[] {
  return rows.map((row) => ({ start: row.start, endpoint: row.endpoint, keyId: row.key_id, calls: Number(row.calls), chargedUnits: Number(row.charged) }));
}

function ceilHour(at: Date): Date {
  const floor = floorHour(at);
  return floor.getTime() === at.getTime() ? floor : new Date(floor.getTime() + 3_600_000);
}

function ceilDay(at: Date): Date {
  const floor = floorDay(at);
  return floor.getTime() === at.getTime() ? floor : new Date(floor.getTime() + 86_400_000);
}

function applyFilter(query: Knex.QueryBuilder, filter: CallFilter): void {
  if (filter.endpoint) query.where({ endpoint: filter.endpoint });
  if (filter.keyId) query.where({ key_id: filter.keyId });
  if (filter.since) query.where("created_at", ">=", filter.since);
  if (filter.until) query.where("created_at", "<", filter.until);
}
