import type { Knex } from "knex";
import { describe, expect, it } from "vitest";
import { readRolledUntil, rollClosedHours, rollOneHour } from "../../src/metering/usage-rollup.js";
import { createTestAccount } from "../support/app.js";
import { sessionsCanRace, useRacingDatabase } from "../support/database.js";
import { waitFor } from "../support/wait.js";

/**
 * The roll-up as replicas run it: two at once never count an hour twice, and
 * one killed in the middle of an hour leaves nothing of it behind. Sessions
 * that really run at once need a real PostgreSQL server.
 */
const HOUR = 3_600_000;
const T0 = Date.UTC(2026, 5, 1);
const HOURS = 72;

/** Hours whose usage_hourly rows differ from the calls counted directly (none when every hour is counted once). */
async function mismatchedHours(db: Knex, before: Date): Promise<number> {
  const result = await db.raw(
    `WITH direct AS (
       SELECT account_id, date_trunc('hour', created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour, endpoint::text AS endpoint, key_id,
              count(*) AS calls, sum(charged) AS charged
         FROM requests WHERE status IN ('settled', 'released', 'expired') AND created_at < ?
        GROUP BY 1, 2, 3, 4)
     SELECT count(*)::integer AS n
       FROM direct d FULL JOIN usage_hourly u
         ON u.account_id = d.account_id AND u.hour = d.hour AND u.endpoint = d.endpoint AND u.key_id IS NOT DISTINCT FROM d.key_id
      WHERE d.calls IS DISTINCT FROM u.calls OR d.charged IS DISTINCT FROM u.charged`,
    [before],
  );
  return result.rows[0].n;
}

describe.runIf(sessionsCanRace)("the roll-up on replicas", () => {
  const database = useRacingDatabase(10);

  async function seed(): Promise<void> {
    const db = database();
    await db.raw("TRUNCATE usage_hourly, usage_daily");
    await db.raw("UPDATE usage_rollup_state SET rolled_until = NULL");
    await db.raw("DELETE FROM requests");
    const accounts = [await createTestAccount(db), await createTestAccount(db)];
    // A call every 30 seconds for three days, the two accounts, endpoints and statuses in turn.
    await db.raw(
      `INSERT INTO requests (account_id, endpoint, funding, reserved, charged, status, created_at, lease_expires_at, resolved_at, key_id)
       SELECT CASE WHEN i % 2 = 0 THEN :a::uuid ELSE :b::uuid END, CASE WHEN i % 3 = 0 THEN 'decide' ELSE 'search' END, 'paid', 100,
              CASE WHEN i % 5 = 0 THEN 0 ELSE i % 100 END, CASE WHEN i % 5 = 0 THEN 'released' ELSE 'settled' END,
              t, t + interval '1 minute', t + interval '10 milliseconds', CASE WHEN i % 7 = 0 THEN NULL WHEN i % 2 = 0 THEN :ka::uuid ELSE :kb::uuid END
         FROM generate_series(0, :n - 1) AS i, LATERAL (SELECT :t0::timestamptz + i * interval '30 seconds' AS t) AS times`,
      { a: accounts[0]!.accountId, b: accounts[1]!.accountId, ka: accounts[0]!.keyId, kb: accounts[1]!.keyId, n: HOURS * 120, t0: new Date(T0) },
    );
  }

  it("two roll-ups at once count every hour once between them", async () => {
    await seed();
    const db = database();
    const timing = { now: () => new Date(T0 + (HOURS + 1) * HOUR), delayMs: 1_000 };
    const [first, second] = await Promise.all([rollClosedHours(db, timing), rollClosedHours(db, timing)]);
    expect(first + second).toBe(HOURS);
    expect(await readRolledUntil(db)).toEqual(new Date(T0 + HOURS * HOUR));
    expect(await mismatchedHours(db, new Date(T0 + HOURS * HOUR))).toBe(0);
  }, 120_000);

  it("a roll-up whose session is killed mid-hour leaves neither rows nor a moved watermark, and the next one counts the hour", async () => {
    await seed();
    const db = database();
    const timing = { now: () => new Date(T0 + 3 * HOUR), delayMs: 1_000 };
    expect(await rollOneHour(db, timing)).toBe("rolled");
    // Another session holds usage_hourly, so the next roll stops at its insert, the watermark already moved in its transaction.
    const holder = await db.transaction();
    await holder.raw("LOCK TABLE usage_hourly IN SHARE MODE");
    // The expectation is attached now: the roll fails while the kill's own reply is awaited, and a rejection nobody handles yet is an error of the run.
    const rollingFails = expect(rollOneHour(db, timing)).rejects.toThrow();
    let pid = 0;
    await waitFor(async () => {
      const waiting = await db.raw(`SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO usage_hourly%'`);
      pid = waiting.rows[0]?.pid ?? 0;
      return pid !== 0;
    }, "the roll to wait at its insert");
    await db.raw("SELECT pg_terminate_backend(?)", [pid]);
    await rollingFails;
    await holder.commit();
    expect(await readRolledUntil(db)).toEqual(new Date(T0 + HOUR));
    expect((await db("usage_hourly").where({ hour: new Date(T0 + HOUR) })).length).toBe(0);
    expect(await rollClosedHours(db, timing)).toBe(1);
    expect(await mismatchedHours(db, new Date(T0 + 2 * HOUR))).toBe(0);
  }, 120_000);
});
