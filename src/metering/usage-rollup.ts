import type { Knex } from "knex";

/**
 * The usage roll-up: finished calls of every account counted per UTC hour,
 * endpoint and key into usage_hourly (and added to their day in
 * usage_daily), one closed hour per transaction, so that usage summaries
 * read a few rows per hour or day instead of every call.
 *
 * The calls of an hour never change once the hour is closed: a finished call
 * is never changed again (only its idempotency key and stored answer are
 * cleared) and no call is ever deleted. An hour is closed when it ended at
 * least `delayMs` ago (longer than an admission takes to commit, so no call
 * dated in it can still appear) and no call started in it is still active
 * (an active call becomes settled, released or expired later).
 *
 * The watermark `rolled_until` lives in a one-row table. Rolling an hour
 * locks that row, counts the hour, and moves the watermark in the same
 * transaction: replicas take turns, and a crash leaves the hour counted with
 * the watermark moved, or neither.
 */

/** The statuses of a finished call, the ones usage counts. */
const COUNTED = `('settled', 'released', 'expired')`;
const HOUR_MS = 3_600_000;
const DAY_MS = 86_400_000;

export interface RollupTiming {
  /** The wall clock. */
  now: () => Date;
  /** How long after its end an hour may be rolled. */
  delayMs: number;
}

/** What one attempt did: rolled an hour, or why it rolled none. */
export type RollStep = "rolled" | "caught_up" | "waiting_for_active";

/** The start of the UTC hour that holds `at`. */
export function floorHour(at: Date): Date {
  return new Date(Math.floor(at.getTime() / HOUR_MS) * HOUR_MS);
}

/** The start of the UTC day that holds `at`. */
export function floorDay(at: Date): Date {
  return new Date(Math.floor(at.getTime() / DAY_MS) * DAY_MS);
}

/** Hours that ended at or before this instant may be rolled. */
function closedBefore(timing: RollupTiming): Date {
  return floorHour(new Date(timing.now().getTime() - timing.delayMs));
}

/** Every hour before this one is counted in usage_hourly; undefined before the first roll. */
export async function readRolledUntil(db: Knex | Knex.Transaction): Promise<Date | undefined> {
  const row = await db("usage_rollup_state").first("rolled_until");
  return row?.rolled_until ?? undefined;
}

/**
 * Rolls the oldest hour not yet counted, if it is closed, in one transaction.
 * A replica that finds the state row locked waits for the other's hour, then
 * sees its watermark.
 */
export async function rollOneHour(db: Knex, timing: RollupTiming): Promise<RollStep> {
  return db.transaction(async (trx) => {
    const state = await trx.raw(`SELECT rolled_until FROM usage_rollup_state FOR UPDATE`);
    const limit = closedBefore(timing);
    let hour: Date | undefined = state.rows[0]?.rolled_until ?? undefined;
    if (!hour) {
      // The first roll starts at the oldest call; a call not yet visible is dated after the limit.
      const first = await trx.raw(
        `SELECT min(f.created_at) AS first
           FROM accounts a
           CROSS JOIN LATERAL (SELECT r.created_at FROM requests r WHERE r.account_id = a.id ORDER BY r.created_at LIMIT 1) f`,
      );
      const oldest: Date | null = first.rows[0]?.first ?? null;
      hour = oldest && floorHour(oldest) < limit ? floorHour(oldest) : limit;
      await trx("usage_rollup_state").update({ rolled_until: hour });
    }
    if (hour.getTime() >= limit.getTime()) return "caught_up";
    const end = new Date(hour.getTime() + HOUR_MS);
    const active = await trx.raw(`SELECT 1 FROM requests WHERE status = 'active' AND created_at >= ? AND created_at < ? LIMIT 1`, [hour, end]);
    if (active.rows.length > 0) return "waiting_for_active";
    await trx("usage_rollup_state").update({ rolled_until: end });
    await trx.raw(
      `INSERT INTO usage_hourly (account_id, hour, endpoint, key_id, calls, charged)
       SELECT account_id, ?, endpoint, key_id, count(*), coalesce(sum(charged), 0)
         FROM requests
        WHERE created_at >= ? AND created_at < ? AND status IN ${COUNTED}
        GROUP BY account_id, endpoint, key_id`,
      [hour, hour, end],
    );
    // The hour joins its day's counts; a day is complete once its last hour is rolled.
    await trx.raw(
      `INSERT INTO usage_daily (account_id, day, endpoint, key_id, calls, charged)
       SELECT account_id, ?, endpoint, key_id, calls, charged FROM usage_hourly WHERE hour = ?
       ON CONFLICT (account_id, day, endpoint, (coalesce(key_id, '00000000-0000-0000-0000-000000000000'::uuid)))
       DO UPDATE SET calls = usage_daily.calls + excluded.calls, charged = usage_daily.charged + excluded.charged`,
      [floorDay(hour), hour],
    );
    return "rolled";
  });
}

/**
 * Brings the BRIN index on requests(created_at) up to the newest pages, so
 * that finding an hour's calls reads that hour's pages, not every page
 * written since autovacuum last summarized (or ever, where it is off). It
 * waits for no lock: while a vacuum holds the table, the next tick does it.
 */
export async function summarizeNewPages(db: Knex): Promise<void> {
  try {
    await db.transaction(async (trx) => {
      await trx.raw("SET LOCAL lock_timeout = '200ms'");
      await trx.raw("SELECT brin_summarize_new_values('requests_created_brin')");
    });
  } catch (err) {
    if ((err as { code?: string }).code !== "55P03") throw err;
  }
}

/**
 * Rolls closed hours one by one until none is left, an active call holds the
 * next one back, or `signal` aborts. Returns the number of hours rolled.
 */
export async function rollClosedHours(db: Knex, timing: RollupTiming, signal?: AbortSignal): Promise<number> {
  // Most ticks find no hour closed since the last: they leave the index alone.
  const rolledUntil = await readRolledUntil(db);
  if (rolledUntil && rolledUntil.getTime() >= closedBefore(timing).getTime()) return 0;
  await summarizeNewPages(db);
  let rolled = 0;
  while (!signal?.aborted && (await rollOneHour(db, timing)) === "rolled") rolled++;
  return rolled;
}
