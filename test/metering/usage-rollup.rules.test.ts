import type { Knex } from "knex";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { createKnex } from "../../src/db/database.js";
import { createApiKey } from "../../src/keys/store.js";
import { summarizeCalls, summarizeCallsFromRequests, type SummaryRange, type UsageBucketRow } from "../../src/metering/account-views.js";
import { floorDay, floorHour, readRolledUntil, rollClosedHours, rollOneHour, summarizeNewPages } from "../../src/metering/usage-rollup.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, sessionsCanRace, useRacingDatabase, type TestDatabase } from "../support/database.js";

/**
 * The roll-up's and the usage summary's rules on hand-worked examples, each
 * figure written out: where an hour and a day start, when an hour may be
 * rolled, what a rolled hour and day hold, and which table a summary reads
 * for which part of its range. usage-rollup.test.ts holds the property that
 * a summary always equals counting every call; these are the quick cases
 * `npm run mutate` runs.
 */
let database: TestDatabase;
let db: Knex;
let account: string;
let otherAccount: string;
let key: string;
let otherKey: string;
const HOUR = 3_600_000;
const DAY = 24 * HOUR;
/** A Monday, 00:00 UTC. */
const T0 = Date.UTC(2027, 1, 1);
const at = (ms: number) => new Date(T0 + ms);

beforeAll(async () => {
  // The roll-up's watermark is one for every account: a store of its own.
  database = await createTestDatabase(4, { sweepsEveryAccount: true });
  db = database.db;
  const first = await createTestAccount(db);
  const second = await createTestAccount(db);
  account = first.accountId;
  key = first.keyId;
  otherKey = (await createApiKey(db, account, { name: "other" })).keyId;
  otherAccount = second.accountId;
}, 120_000);
afterAll(async () => {
  await database?.close();
});

interface Call {
  atMs: number;
  endpoint?: "decide" | "search";
  status?: "settled" | "released" | "expired" | "active";
  charged?: number;
  keyId?: string | null;
  accountId?: string;
}

async function insertCalls(calls: Call[]): Promise<void> {
  await db("requests").insert(
    calls.map((c) => ({
      account_id: c.accountId ?? account,
      endpoint: c.endpoint ?? "decide",
      funding: "paid",
      reserved: 1_000,
      charged: c.charged ?? 0,
      status: c.status ?? "settled",
      created_at: at(c.atMs),
      lease_expires_at: at(c.atMs + 60_000),
      resolved_at: c.status === "active" ? null : at(c.atMs + 10),
      key_id: c.keyId === undefined ? key : c.keyId,
    })),
  );
}

async function reset(): Promise<void> {
  await db.raw("TRUNCATE usage_hourly, usage_daily");
  await db.raw("UPDATE usage_rollup_state SET rolled_until = NULL");
  await db("requests").whereIn("account_id", [account, otherAccount]).del();
}

const timing = (nowMs: number, delayMs = 60_000) => ({ now: () => at(nowMs), delayMs });
const hourly = async () =>
  (await db("usage_hourly").orderBy(["hour", "account_id", "endpoint", "key_id"]).select("account_id", "hour", "endpoint", "key_id", "calls", "charged")).map((r) => ({
    ...r,
    hour: r.hour.getTime() - T0,
    calls: Number(r.calls),
    charged: Number(r.charged),
  }));
const daily = async () =>
  (await db("usage_daily").orderBy(["day", "endpoint"]).select("day", "endpoint", "key_id", "calls", "charged")).map((r) => ({
    ...r,
    day: r.day.getTime() - T0,
    calls: Number(r.calls),
    charged: Number(r.charged),
  }));
/** A summary's buckets as [start − T0, endpoint, key, calls, charged]. */
const rows = (buckets: UsageBucketRow[]) => buckets.map((b) => [b.start.getTime() - T0, b.endpoint, b.keyId, b.calls, b.chargedUnits]);

describe("hours and days", () => {
  it.each([
    [0, 0, 0],
    [HOUR - 1, 0, 0],
    [HOUR, HOUR, 0],
    [DAY + 5 * HOUR + 59 * 60_000, DAY + 5 * HOUR, DAY],
    [2 * DAY - 1, DAY + 23 * HOUR, DAY],
    [-1, -HOUR, -DAY],
  ])("T0 + %i ms is in the hour at T0 + %i and the day at T0 + %i", (ms, hour, day) => {
    expect(floorHour(at(ms)).getTime() - T0).toBe(hour);
    expect(floorDay(at(ms)).getTime() - T0).toBe(day);
  });
});

describe("rolling", () => {
  beforeEach(reset);

  it("with no call anywhere, the first roll sets the watermark to the last closed hour and rolls nothing", async () => {
    expect(await readRolledUntil(db)).toBeUndefined();
    expect(await rollOneHour(db, timing(5 * HOUR + 30 * 60_000, 10 * 60_000))).toBe("caught_up");
    expect(await readRolledUntil(db)).toEqual(at(5 * HOUR));
    expect(await hourly()).toEqual([]);
  });

  it("when the oldest call is in an hour not yet closed, the first roll sets the watermark to the last closed hour", async () => {
    await insertCalls([{ atMs: 6 * HOUR + 1 }]);
    expect(await rollOneHour(db, timing(6 * HOUR + 5 * 60_000, 10 * 60_000))).toBe("caught_up");
    expect(await readRolledUntil(db)).toEqual(at(5 * HOUR));
  });

  it("an hour is closed once it ended `delayMs` ago, and not a millisecond before", async () => {
    await insertCalls([{ atMs: 2 * HOUR + 5, charged: 3 }]);
    expect(await rollOneHour(db, timing(3 * HOUR + 60_000 - 1))).toBe("caught_up");
    expect(await readRolledUntil(db)).toEqual(at(2 * HOUR));
    expect(await rollOneHour(db, timing(3 * HOUR + 60_000 - 1))).toBe("caught_up");
    expect(await rollOneHour(db, timing(3 * HOUR + 60_000))).toBe("rolled");
    expect(await readRolledUntil(db)).toEqual(at(3 * HOUR));
    expect(await rollOneHour(db, timing(3 * HOUR + 60_000))).toBe("caught_up");
  });

  it("an hour's row holds its finished calls per account, endpoint and key; calls on its edges go to the right hour", async () => {
    await insertCalls([
      { atMs: 0, charged: 5 },
      { atMs: HOUR - 1, charged: 7 },
      { atMs: HOUR - 2, charged: 1, status: "released" },
      { atMs: 30, endpoint: "search", charged: 2, keyId: otherKey },
      { atMs: 40, status: "expired", keyId: null },
      { atMs: 50, accountId: otherAccount, keyId: null, charged: 9 },
      { atMs: HOUR, charged: 100 },
    ]);
    expect(await rollClosedHours(db, timing(2 * HOUR - 1, 1_000))).toBe(1);
    const expected = [
      { account_id: account, hour: 0, endpoint: "decide", key_id: key, calls: 3, charged: 13 },
      { account_id: account, hour: 0, endpoint: "decide", key_id: null, calls: 1, charged: 0 },
      { account_id: account, hour: 0, endpoint: "search", key_id: otherKey, calls: 1, charged: 2 },
      { account_id: otherAccount, hour: 0, endpoint: "decide", key_id: null, calls: 1, charged: 9 },
    ];
    const sort = (list: typeof expected) => [...list].sort((a, b) => JSON.stringify(a).localeCompare(JSON.stringify(b)));
    expect(sort(await hourly())).toEqual(sort(expected));
    expect(await readRolledUntil(db)).toEqual(at(HOUR));
  });

  it("a day's row adds up its rolled hours; the next day starts a row of its own", async () => {
    await insertCalls([
      { atMs: 22 * HOUR, charged: 4 },
      { atMs: 23 * HOUR + 1, charged: 6 },
      { atMs: 23 * HOUR + 2, charged: 1 },
      { atMs: DAY, charged: 50 },
    ]);
    expect(await rollClosedHours(db, timing(DAY + 2 * HOUR, 1_000))).toBe(3);
    expect(await daily()).toEqual([
      { day: 0, endpoint: "decide", key_id: key, calls: 3, charged: 11 },
      { day: DAY, endpoint: "decide", key_id: key, calls: 1, charged: 50 },
    ]);
    // An hour with no call leaves no row, but is rolled all the same.
    expect((await hourly()).map((r) => [r.hour, r.calls])).toEqual([
      [22 * HOUR, 1],
      [23 * HOUR, 2],
      [DAY, 1],
    ]);
    expect(await readRolledUntil(db)).toEqual(at(DAY + HOUR));
  });

  it("a call still active holds its hour back, whatever the account; one active in a later hour does not", async () => {
    await insertCalls([
      { atMs: 0, charged: 1 },
      { atMs: 2 * HOUR + 10, status: "active", accountId: otherAccount, keyId: null },
    ]);
    expect(await rollClosedHours(db, timing(5 * HOUR, 1_000))).toBe(2);
    expect(await rollOneHour(db, timing(5 * HOUR, 1_000))).toBe("waiting_for_active");
    expect(await readRolledUntil(db)).toEqual(at(2 * HOUR));
    await db("requests").where({ account_id: otherAccount, status: "active" }).update({ status: "settled", charged: 0, resolved_at: at(2 * HOUR + 20) });
    expect(await rollClosedHours(db, timing(5 * HOUR, 1_000))).toBe(2);
    expect(await rollClosedHours(db, timing(5 * HOUR, 1_000))).toBe(0);
    expect(await readRolledUntil(db)).toEqual(at(4 * HOUR));
  });

  it("stops between hours when its signal aborts", async () => {
    await insertCalls([{ atMs: 0 }]);
    const stop = new AbortController();
    stop.abort();
    expect(await rollClosedHours(db, timing(4 * HOUR, 1_000), stop.signal)).toBe(0);
    expect(await readRolledUntil(db)).toBeUndefined();
    expect(await rollClosedHours(db, timing(4 * HOUR, 1_000), new AbortController().signal)).toBe(3);
  });

  it("refreshes the index only when an hour has closed since the last roll, and fails on any error but a lock held by someone else", async () => {
    await insertCalls([{ atMs: 0 }]);
    expect(await rollClosedHours(db, timing(2 * HOUR, 1_000))).toBe(1);
    expect(await rollClosedHours(db, timing(2 * HOUR, 1_000))).toBe(0);
    const closed = createKnex(database.url, 1);
    await closed.destroy();
    await expect(summarizeNewPages(closed)).rejects.toThrow();
    await insertCalls([{ atMs: HOUR + 1 }]);
    expect(await rollClosedHours(db, timing(3 * HOUR, 1_000))).toBe(1);
  });
});

describe("a usage summary", () => {
  beforeEach(reset);

  const range = (sinceMs: number, untilMs: number, more: Partial<SummaryRange> = {}): SummaryRange => ({
    since: at(sinceMs),
    until: at(untilMs),
    granularity: "hour",
    ...more,
  });

  it("counted from the calls: finished ones only, of this account, in [since, until), per hour or day, endpoint, and key when asked", async () => {
    await insertCalls([
      { atMs: 0, charged: 5 },
      { atMs: 10, charged: 6, keyId: otherKey },
      { atMs: 20, endpoint: "search", charged: 1, keyId: null },
      { atMs: 30, status: "active" },
      { atMs: 40, accountId: otherAccount, keyId: null, charged: 50 },
      { atMs: HOUR + 1, status: "released" },
      { atMs: DAY + 1, charged: 7 },
      { atMs: DAY + HOUR, charged: 8 },
    ]);
    expect(rows(await summarizeCallsFromRequests(db, account, range(0, DAY + HOUR)))).toEqual([
      [0, "decide", "", 2, 11],
      [0, "search", "", 1, 1],
      [HOUR, "decide", "", 1, 0],
      [DAY, "decide", "", 1, 7],
    ]);
    expect(rows(await summarizeCallsFromRequests(db, account, range(10, 2 * DAY, { granularity: "day" })))).toEqual([
      [0, "decide", "", 2, 6],
      [0, "search", "", 1, 1],
      [DAY, "decide", "", 2, 15],
    ]);
    expect(rows(await summarizeCallsFromRequests(db, account, range(0, HOUR, { byKey: true })))).toEqual([
      // Ordered by start, endpoint, then key.
      ...[
        [0, "decide", key, 1, 5],
        [0, "decide", otherKey, 1, 6],
      ].sort((a, b) => String(a[2]).localeCompare(String(b[2]))),
      [0, "search", "", 1, 1],
    ]);
    expect(rows(await summarizeCallsFromRequests(db, account, range(0, 2 * DAY, { keyId: otherKey, granularity: "day" })))).toEqual([[0, "decide", "", 1, 6]]);
  });

  it("without a watermark, and for a range inside one hour, counts from the calls", async () => {
    await insertCalls([{ atMs: HOUR + 5, charged: 3 }]);
    expect(rows(await summarizeCalls(db, account, range(0, 3 * HOUR)))).toEqual([[HOUR, "decide", "", 1, 3]]);
    await rollClosedHours(db, timing(3 * HOUR, 1_000));
    await db("usage_hourly").update({ calls: 70 });
    // Calls just outside the range, in the same hour, stay out.
    await insertCalls([
      { atMs: HOUR, charged: 20 },
      { atMs: 2 * HOUR - 1, charged: 40 },
    ]);
    expect(rows(await summarizeCalls(db, account, range(HOUR + 1, 2 * HOUR - 1)))).toEqual([[HOUR, "decide", "", 1, 3]]);
  });

  it("reads each whole rolled hour from usage_hourly, and the partial hours at both ends and every hour from the watermark on from the calls", async () => {
    await insertCalls([
      { atMs: 30, charged: 1 },
      { atMs: HOUR + 30, charged: 2 },
      { atMs: 2 * HOUR + 30, charged: 3 },
      { atMs: 3 * HOUR + 30, charged: 4 },
      { atMs: 4 * HOUR + 30, charged: 5 },
    ]);
    await rollClosedHours(db, timing(4 * HOUR, 1_000));
    expect(await readRolledUntil(db)).toEqual(at(3 * HOUR));
    // Marked: a rolled hour read from usage_hourly counts 10 calls.
    await db("usage_hourly").update({ calls: 10 });
    expect(rows(await summarizeCalls(db, account, range(1, 5 * HOUR)))).toEqual([
      [0, "decide", "", 1, 1],
      [HOUR, "decide", "", 10, 2],
      [2 * HOUR, "decide", "", 10, 3],
      [3 * HOUR, "decide", "", 1, 4],
      [4 * HOUR, "decide", "", 1, 5],
    ]);
    // A range that ends inside a rolled hour counts that hour's part from the calls, and nothing after it.
    expect(rows(await summarizeCalls(db, account, range(0, 2 * HOUR + 31)))).toEqual([
      [0, "decide", "", 10, 1],
      [HOUR, "decide", "", 10, 2],
      [2 * HOUR, "decide", "", 1, 3],
    ]);
    // A range that ends before the watermark reads no rolled hour after its end.
    expect(rows(await summarizeCalls(db, account, range(0, HOUR)))).toEqual([[0, "decide", "", 10, 1]]);
  });

  it("per day, reads a whole rolled day from usage_daily, and the rolled hours of a partial day from usage_hourly", async () => {
    await insertCalls([
      { atMs: DAY + 30, charged: 1, keyId: otherKey },
      { atMs: DAY + 5 * HOUR, charged: 2 },
      { atMs: 2 * DAY + 30, charged: 3 },
      { atMs: 2 * DAY + HOUR + 30, charged: 4 },
      { atMs: 2 * DAY + 3 * HOUR, charged: 5 },
    ]);
    await rollClosedHours(db, timing(2 * DAY + 2 * HOUR + 1_000, 1_000));
    expect(await readRolledUntil(db)).toEqual(at(2 * DAY + 2 * HOUR));
    await db("usage_daily").update({ calls: 100 });
    await db("usage_hourly").update({ calls: 10 });
    const day = { granularity: "day" as const };
    // Day 1 is whole and rolled: usage_daily. Day 2 is rolled for two hours (usage_hourly), then counted from the calls.
    expect(rows(await summarizeCalls(db, account, range(0, 3 * DAY, day)))).toEqual([
      [DAY, "decide", "", 200, 3],
      [2 * DAY, "decide", "", 21, 12],
    ]);
    // Starting on day 1's first hour: the whole day from usage_daily.
    expect(rows(await summarizeCalls(db, account, range(DAY, 3 * DAY, day)))).toEqual([
      [DAY, "decide", "", 200, 3],
      [2 * DAY, "decide", "", 21, 12],
    ]);
    // Starting inside day 1, that day is partial: its rolled hours come from usage_hourly.
    expect(rows(await summarizeCalls(db, account, range(DAY + HOUR, 3 * DAY, day)))).toEqual([
      [DAY, "decide", "", 10, 2],
      [2 * DAY, "decide", "", 21, 12],
    ]);
    // Starting on a day's first hour but a moment late: its first hour is partial, counted from the calls.
    expect(rows(await summarizeCalls(db, account, range(DAY + 1, 2 * DAY, day)))).toEqual([[DAY, "decide", "", 11, 3]]);
    // Grouped by key, and of one key, the rolled rows keep their key.
    expect(rows(await summarizeCalls(db, account, range(0, 2 * DAY, { ...day, byKey: true })))).toEqual(
      [
        [DAY, "decide", key, 100, 2],
        [DAY, "decide", otherKey, 100, 1],
      ].sort((a, b) => String(a[2]).localeCompare(String(b[2]))),
    );
    expect(rows(await summarizeCalls(db, account, range(0, 3 * DAY, { ...day, keyId: otherKey })))).toEqual([[DAY, "decide", "", 100, 1]]);
    expect(rows(await summarizeCalls(db, account, range(0, 3 * DAY, { keyId: otherKey })))).toEqual([[DAY, "decide", "", 10, 1]]);
  });

  it("never reads another account's rolled rows", async () => {
    await insertCalls([
      { atMs: 30, charged: 1 },
      { atMs: 40, accountId: otherAccount, keyId: null, charged: 9 },
    ]);
    await rollClosedHours(db, timing(2 * DAY, 1_000));
    expect(rows(await summarizeCalls(db, account, range(0, DAY)))).toEqual([[0, "decide", "", 1, 1]]);
    expect(rows(await summarizeCalls(db, account, range(0, DAY, { granularity: "day" })))).toEqual([[0, "decide", "", 1, 1]]);
    expect(rows(await summarizeCalls(db, otherAccount, range(0, DAY, { granularity: "day" })))).toEqual([[0, "decide", "", 1, 9]]);
  });
});

describe.runIf(sessionsCanRace)("refreshing the index while someone holds the table", () => {
  const racing = useRacingDatabase(2);

  it("gives up after a short wait, without an error", async () => {
    const twoSessions = racing();
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let locked!: () => void;
    const isLocked = new Promise<void>((resolve) => (locked = resolve));
    // What a vacuum of the table holds: the lock brin_summarize_new_values needs.
    const held = twoSessions.transaction(async (tx) => {
      await tx.raw("LOCK TABLE requests IN SHARE UPDATE EXCLUSIVE MODE");
      locked();
      await released;
    });
    await isLocked;
    try {
      await expect(summarizeNewPages(twoSessions)).resolves.toBeUndefined();
    } finally {
      release();
      await held;
    }
    await expect(summarizeNewPages(twoSessions)).resolves.toBeUndefined();
  });

  it("a replica that finds no hour closed since the last roll does not queue behind another replica's roll", async () => {
    const twoSessions = racing();
    const now = timing(Date.now() - T0, 1_000);
    await rollClosedHours(twoSessions, now);
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    let locked!: () => void;
    const isLocked = new Promise<void>((resolve) => (locked = resolve));
    // Another replica rolling an hour holds the state row.
    const held = twoSessions.transaction(async (tx) => {
      await tx.raw("SELECT rolled_until FROM usage_rollup_state FOR UPDATE");
      locked();
      await released;
    });
    await isLocked;
    try {
      expect(await rollClosedHours(twoSessions, now)).toBe(0);
    } finally {
      release();
      await held;
    }
  });
});
