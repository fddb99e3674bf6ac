import fc from "fast-check";
import type { Knex } from "knex";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { createApiKey } from "../../src/keys/store.js";
import { summarizeCalls, summarizeCallsFromRequests, type SummaryRange } from "../../src/metering/account-views.js";
import { floorHour, readRolledUntil, rollClosedHours, rollOneHour } from "../../src/metering/usage-rollup.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { waitFor } from "../support/wait.js";
import { startAccountApp } from "../session-door/support.js";

/**
 * Usage summaries read closed hours from the roll-up and count the rest from
 * the calls: whatever the range, key, grouping and watermark, the answer is
 * the one counting every call gives.
 */
let database: TestDatabase;
let db: Knex;
let accounts: string[];
let keys: string[];
const HOUR = 3_600_000;
const T0 = Date.UTC(2026, 2, 1);
const STATUSES = ["settled", "released", "expired", "active"] as const;

beforeAll(async () => {
  // The roll-up counts every account's calls: a store of its own.
  database = await createTestDatabase(10, { sweepsEveryAccount: true });
  db = database.db;
  const first = await createTestAccount(db);
  const second = await createTestAccount(db);
  const other = await createApiKey(db, first.accountId, { name: "other" });
  accounts = [first.accountId, second.accountId];
  keys = [first.keyId, other.keyId, second.keyId];
}, 120_000);
afterAll(async () => {
  await database?.close();
});

interface Call {
  account: 0 | 1;
  atMs: number;
  endpoint: "decide" | "search";
  /** 0 and 1 are the first account's keys; 2 is no key. */
  key: 0 | 1 | 2;
  status: (typeof STATUSES)[number];
  charged: number;
}

async function reset(): Promise<void> {
  await db.raw("TRUNCATE usage_hourly, usage_daily");
  await db.raw("UPDATE usage_rollup_state SET rolled_until = NULL");
  await db("requests").whereIn("account_id", accounts).del();
}

async function insertCalls(calls: Call[]): Promise<void> {
  if (calls.length === 0) return;
  await db("requests").insert(
    calls.map((call) => {
      const at = new Date(T0 + call.atMs);
      return {
        account_id: accounts[call.account],
        endpoint: call.endpoint,
        funding: "paid",
        reserved: 1_000,
        charged: call.status === "settled" ? call.charged : 0,
        status: call.status,
        created_at: at,
        lease_expires_at: new Date(at.getTime() + 60_000),
        resolved_at: call.status === "active" ? null : new Date(at.getTime() + 10),
        key_id: call.key === 2 ? null : call.account === 0 ? keys[call.key] : keys[2],
      };
    }),
  );
}

const callArb: fc.Arbitrary<Call> = fc.record({
  account: fc.constantFrom(0 as const, 1 as const),
  // Within two days, on and off the hour's edges.
  atMs: fc.oneof(fc.integer({ min: 0, max: 48 * HOUR - 1 }), fc.integer({ min: 0, max: 47 }).map((h) => h * HOUR), fc.integer({ min: 1, max: 48 }).map((h) => h * HOUR - 1)),
  endpoint: fc.constantFrom("decide" as const, "search" as const),
  key: fc.constantFrom(0 as const, 1 as const, 2 as const),
  status: fc.constantFrom("settled" as const, "released" as const, "expired" as const),
  charged: fc.integer({ min: 0, max: 1_000 }),
});
/** A few calls still in flight: each holds its hour, and the ones after it, back from the roll-up. */
const activeArb: fc.Arbitrary<Call> = callArb.map((call) => ({ ...call, status: "active" as const }));

const DAY = 24 * HOUR;
const offsetArb = fc.oneof(
  fc.integer({ min: -2 * HOUR, max: 50 * HOUR }),
  fc.integer({ min: -2, max: 50 }).map((h) => h * HOUR),
  fc.integer({ min: -1, max: 2 }).map((d) => d * DAY),
);
const queryArb: fc.Arbitrary<Query> = fc.record({
  a: offsetArb,
  b: offsetArb,
  granularity: fc.constantFrom("day" as const, "hour" as const),
  key: fc.constantFrom(undefined, 0, 1),
  byKey: fc.boolean(),
});

interface Query {
  a: number;
  b: number;
  granularity: "day" | "hour";
  key: number | undefined;
  byKey: boolean;
}

/** Each query's summary with the roll-up is the one counted from every call. */
async function compare(queries: Query[]): Promise<void> {
  for (const q of queries) {
    if (q.a === q.b) continue;
    const range: SummaryRange = {
      since: new Date(T0 + Math.min(q.a, q.b)),
      until: new Date(T0 + Math.max(q.a, q.b)),
      granularity: q.granularity,
      keyId: q.key === undefined ? undefined : keys[q.key],
      byKey: q.byKey,
    };
    expect(await summarizeCalls(db, accounts[0]!, range)).toEqual(await summarizeCallsFromRequests(db, accounts[0]!, range));
  }
}

describe("a summary with the roll-up", () => {
  beforeEach(reset);

  it("equals counting every call, for any range, key, grouping and watermark", async () => {
    let rolledRuns = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.array(callArb, { maxLength: 120 }),
        fc.array(activeArb, { maxLength: 2 }),
        // Now, and so the watermark: anywhere, or past both days.
        fc.oneof(fc.integer({ min: 0, max: 60 * HOUR }), fc.integer({ min: 49 * HOUR, max: 60 * HOUR })),
        fc.integer({ min: 1_000, max: 3 * HOUR }),
        fc.array(queryArb, { minLength: 1, maxLength: 8 }),
        async (calls, active, nowOffset, delayMs, queries) => {
          await reset();
          await insertCalls([...calls, ...active]);
          const rolled = await rollClosedHours(db, { now: () => new Date(T0 + nowOffset), delayMs });
          if (rolled > 0) rolledRuns++;
          await compare(queries);
          // The calls in flight finish after the roll: the summary counts them too.
          await db("requests").whereIn("account_id", accounts).where({ status: "active" }).update({ status: "settled", charged: 9 });
          await compare(queries);
        },
      ),
      { numRuns: 60 },
    );
    // The property held with hours really rolled, not only with the raw count.
    expect(rolledRuns).toBeGreaterThan(20);
  }, 300_000);

  it("reads the rolled hours from usage_hourly and the rest from the calls", async () => {
    await insertCalls([
      { account: 0, atMs: 0, endpoint: "decide", key: 0, status: "settled", charged: 5 },
      { account: 0, atMs: HOUR + 1, endpoint: "decide", key: 0, status: "settled", charged: 7 },
    ]);
    await rollClosedHours(db, { now: () => new Date(T0 + 2 * HOUR), delayMs: 1_000 });
    expect(await readRolledUntil(db)).toEqual(new Date(T0 + HOUR));
    // A rolled hour's row is what the summary reads: changed here, the summary follows it.
    await db("usage_hourly").update({ calls: 40, charged: 400 });
    const range: SummaryRange = { since: new Date(T0), until: new Date(T0 + 2 * HOUR), granularity: "hour" };
    expect((await summarizeCalls(db, accounts[0]!, range)).map((b) => [b.start.getTime() - T0, b.calls, b.chargedUnits])).toEqual([
      [0, 40, 400],
      [HOUR, 1, 7],
    ]);
    // A range that starts inside the rolled hour counts that part from the calls.
    expect((await summarizeCalls(db, accounts[0]!, { ...range, since: new Date(T0 + 1) })).map((b) => b.calls)).toEqual([1]);
  });

  it("reads whole rolled days from usage_daily, and the hours of a partial day from usage_hourly", async () => {
    await insertCalls([
      { account: 0, atMs: 0, endpoint: "search", key: 1, status: "settled", charged: 5 },
      { account: 0, atMs: DAY + 2 * HOUR, endpoint: "search", key: 1, status: "expired", charged: 0 },
    ]);
    await rollClosedHours(db, { now: () => new Date(T0 + DAY + 4 * HOUR), delayMs: 1_000 });
    expect(await db("usage_daily").select("calls")).toEqual([{ calls: 1 }, { calls: 1 }]);
    await db("usage_daily").update({ calls: 30 });
    const range: SummaryRange = { since: new Date(T0), until: new Date(T0 + 2 * DAY), granularity: "day" };
    // The first day is whole and rolled; the second is rolled for three hours only.
    expect((await summarizeCalls(db, accounts[0]!, range)).map((b) => [b.start.getTime() - T0, b.calls])).toEqual([
      [0, 30],
      [DAY, 1],
    ]);
  });
});

describe("rolling an hour", () => {
  beforeEach(reset);

  it("starts at the oldest call's hour and waits for the delay after an hour's end", async () => {
    await insertCalls([{ account: 1, atMs: 5 * HOUR + 30_000, endpoint: "search", key: 2, status: "released", charged: 0 }]);
    const timing = (nowMs: number) => ({ now: () => new Date(T0 + nowMs), delayMs: 10 * 60_000 });
    expect(await rollOneHour(db, timing(6 * HOUR + 10 * 60_000 - 1))).toBe("caught_up");
    expect(await readRolledUntil(db)).toEqual(new Date(T0 + 5 * HOUR));
    expect(await rollOneHour(db, timing(6 * HOUR + 10 * 60_000))).toBe("rolled");
    expect(await readRolledUntil(db)).toEqual(new Date(T0 + 6 * HOUR));
    expect(await db("usage_hourly").select("account_id", "endpoint", "key_id", "calls", "charged")).toEqual([
      { account_id: accounts[1], endpoint: "search", key_id: null, calls: 1, charged: 0 },
    ]);
  });

  it("holds an hour back while a call started in it is active, and counts it once it has expired", async () => {
    await insertCalls([
      { account: 0, atMs: 0, endpoint: "decide", key: 0, status: "settled", charged: 3 },
      { account: 1, atMs: HOUR + 5, endpoint: "decide", key: 2, status: "active", charged: 0 },
      { account: 0, atMs: 2 * HOUR, endpoint: "search", key: 1, status: "settled", charged: 4 },
    ]);
    const timing = { now: () => new Date(T0 + 10 * HOUR), delayMs: 1_000 };
    expect(await rollClosedHours(db, timing)).toBe(1);
    expect(await rollOneHour(db, timing)).toBe("waiting_for_active");
    expect(await readRolledUntil(db)).toEqual(new Date(T0 + HOUR));
    await db("requests").where({ status: "active", account_id: accounts[1] }).update({ status: "expired", resolved_at: new Date(T0 + HOUR + 60_005) });
    expect(await rollClosedHours(db, timing)).toBe(8);
    const rows = await db("usage_hourly").orderBy("hour").select("hour", "calls");
    expect(rows.map((r: { hour: Date; calls: string }) => [r.hour.getTime() - T0, Number(r.calls)])).toEqual([
      [0, 1],
      [HOUR, 1],
      [2 * HOUR, 1],
    ]);
  });

  it("fails whole when it fails part way: neither the hour's rows nor the watermark move", async () => {
    await insertCalls([{ account: 0, atMs: 10, endpoint: "decide", key: 0, status: "settled", charged: 2 }]);
    const timing = { now: () => new Date(T0 + 3 * HOUR), delayMs: 1_000 };
    // A row already there for the hour makes the insert fail after the watermark was moved in the same transaction.
    await db("usage_hourly").insert({ account_id: accounts[0], hour: new Date(T0), endpoint: "decide", key_id: keys[0], calls: 1, charged: 2 });
    await db("usage_rollup_state").update({ rolled_until: new Date(T0) });
    await expect(rollOneHour(db, timing)).rejects.toThrow(/usage_hourly_bucket/);
    expect(await readRolledUntil(db)).toEqual(new Date(T0));
    await db("usage_hourly").del();
    expect(await rollClosedHours(db, timing)).toBe(2);
    expect(await db("usage_hourly").sum({ calls: "calls" })).toEqual([{ calls: "1" }]);
  });
});

describe("the service", () => {
  beforeEach(reset);

  it("rolls closed hours in the background from its start, and stops rolling when stopped", async () => {
    const threeHoursAgo = Date.now() - 3 * HOUR;
    await db("requests").insert({
      account_id: accounts[0],
      endpoint: "decide",
      funding: "paid",
      reserved: 10,
      charged: 4,
      status: "settled",
      created_at: new Date(threeHoursAgo),
      lease_expires_at: new Date(threeHoursAgo + 60_000),
      resolved_at: new Date(threeHoursAgo + 10),
      key_id: keys[0],
    });
    const service = await startAccountApp(database, { TYPESAFE_USAGE_ROLLUP_INTERVAL_MS: "100", TYPESAFE_USAGE_ROLLUP_DELAY_MS: "1000" });
    try {
      const closed = floorHour(new Date(Date.now() - 1_000)).getTime();
      await waitFor(async () => ((await readRolledUntil(db))?.getTime() ?? 0) >= closed, "the service's roll-up to reach the last closed hour");
      expect(await db("usage_hourly").select("calls", "charged")).toEqual([{ calls: 1, charged: 4 }]);
    } finally {
      await service.stop();
    }
  }, 60_000);
});
