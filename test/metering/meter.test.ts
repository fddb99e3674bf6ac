import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateApiKey } from "../../src/keys/api-keys.js";
import { loadConfig } from "../../src/config.js";
import { describeError } from "../../src/errors.js";
import { createLogger } from "../../src/logger.js";
import { createMeter, METER_BATCHING, type MeteredCall, type Meter } from "../../src/metering/meter.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { assertInvariants } from "../support/invariants.js";
import { meteredCall } from "../support/metering.js";

/**
 * The metering wrapper both services use, against the real database: bursts
 * of concurrent calls whose work is held open on a gate, failures, aborts and
 * late settles. On a real PostgreSQL server (DATABASE_URL) the admissions
 * genuinely race on a pool of 10 connections.
 */
let database: TestDatabase;
let meter: Meter;
const metering = loadConfig({}).metering;

beforeAll(async () => {
  database = await createTestDatabase(10);
  meter = createMeter({ db: database.db, config: metering, logger: createLogger("silent") });
});
afterAll(async () => {
  await database?.close();
});

/** A promise resolved from outside: holds work open without sleeping. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { opened, open };
}

const call = meteredCall;

const reasonOf = (err: unknown) => describeError(err).reason;
const row = (accountId: string) => database.db("accounts").where({ id: accountId }).first();

/**
 * Starts `count` calls whose work waits on one gate, waits until each call has
 * either entered its work or been refused, then opens the gate and collects.
 */
async function burst(count: number, makeCall: () => MeteredCall, chargeUnits: number) {
  const upstream = gate();
  const everyCallDecided = gate();
  let entered = 0;
  let refused = 0;
  const decided = () => {
    if (entered + refused === count) everyCallDecided.open();
  };
  const calls = Array.from({ length: count }, () =>
    meter
      .run(makeCall(), async () => {
        entered++;
        decided();
        await upstream.opened;
        return { value: "answer", chargeUnits };
      })
      .then(
        (value) => ({ value }),
        (err: unknown) => {
          refused++;
          decided();
          return { reason: reasonOf(err) };
        },
      ),
  );
  await everyCallDecided.opened;
  const enteredBeforeRelease = entered;
  upstream.open();
  const results = await Promise.all(calls);
  const reasons = results.flatMap((r) => ("reason" in r ? [r.reason] : []));
  const answered = results.flatMap((r) => ("value" in r ? [r.value] : []));
  return { enteredBeforeRelease, reasons, answered };
}

describe("calls in flight together", () => {
  it("share their statements: the admissions that queue behind the first ones go in one, and so do their settles", async () => {
    const accounts = await Promise.all(Array.from({ length: 6 }, () => createTestAccount(database.db, { units: 1_000_000 })));
    const statements: string[] = [];
    const onQuery = (query: { sql: string }) => statements.push(query.sql);
    database.db.on("query", onQuery);
    try {
      const { reasons, answered } = await burst(30, (() => {
        let i = 0;
        return () => call(accounts[i++ % accounts.length]!.apiKey, { freeAllowed: false });
      })(), 1_000);
      expect(reasons).toEqual([]);
      expect(answered).toHaveLength(30);
    } finally {
      database.db.off("query", onQuery);
    }
    // The first calls find a free slot and go alone; the rest queue and go together.
    const { maxBatch, maxInFlight } = METER_BATCHING;
    const expected = maxInFlight + Math.ceil((30 - maxInFlight) / maxBatch);
    expect(statements.filter((sql) => sql.includes("metering_admit"))).toHaveLength(expected);
    expect(statements.filter((sql) => sql.includes("metering_resolve"))).toHaveLength(expected);
    for (const { accountId } of accounts) {
      expect(await row(accountId)).toMatchObject({ balance: 1_000_000 - 5 * 1_000, reserved: 0, in_flight: 0 });
      await assertInvariants(database.db, accountId);
    }
  });
});

describe("40 concurrent calls", () => {
  it("balance for exactly 3 reservations: 3 reach the work, 37 get 402, the 3 settle at their actual cost", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 3 * 32_000 });
    const { enteredBeforeRelease, reasons, answered } = await burst(40, () => call(apiKey), 10_000);
    expect(enteredBeforeRelease).toBe(3);
    expect(reasons).toEqual(Array(37).fill("INSUFFICIENT_BALANCE"));
    expect(answered.map((a) => a.kind === "fresh" && a.billing.chargedCredits)).toEqual([0.01, 0.01, 0.01]);
    expect(await row(accountId)).toMatchObject({ balance: 96_000 - 30_000, reserved: 0, in_flight: 0 });
    await assertInvariants(database.db, accountId);
  });

  it("a rich account: exactly 5 reach the work, 35 get the concurrency 429, and only 5 rate slots are used", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 100 * 32_000 });
    const { enteredBeforeRelease, reasons } = await burst(40, () => call(apiKey), 1_000);
    expect(enteredBeforeRelease).toBe(5);
    expect(reasons).toEqual(Array(35).fill("CONCURRENCY_LIMITED"));
    expect((await row(accountId)).recent).toHaveLength(5);
    await assertInvariants(database.db, accountId);
  });

  it("the last free request goes to one call only; the others pay", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 10 * 32_000, freeRequests: 1 });
    const { answered } = await burst(5, () => call(apiKey), 2_000);
    const fundings = answered.map((a) => a.billing.funding).sort();
    expect(fundings).toEqual(["free", "paid", "paid", "paid", "paid"]);
    expect(await row(accountId)).toMatchObject({ free_remaining: 0, balance: 320_000 - 8_000 });
    await assertInvariants(database.db, accountId);
  });
});

describe("failures after admission give everything back", () => {
  it("work that throws releases the hold and the free request, and the error passes through", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 32_000, freeRequests: 1 });
    for (const freeAllowed of [true, false]) {
      const failure = await meter
        .run(call(apiKey, { freeAllowed }), async () => {
          throw new ConnectError("upstream broke", Code.Unavailable);
        })
        .catch((err: unknown) => err);
      expect(failure).toBeInstanceOf(ConnectError);
    }
    expect(await row(accountId)).toMatchObject({ balance: 32_000, reserved: 0, free_remaining: 1, free_reserved: 0, in_flight: 0 });
    await assertInvariants(database.db, accountId);
  });

  it("a caller that goes away aborts the work and releases the hold", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 32_000 });
    const caller = new AbortController();
    const workStarted = gate();
    let workSignal: AbortSignal | undefined;
    const running = meter.run(call(apiKey, { signal: caller.signal, freeAllowed: false }), async (signal) => {
      workSignal = signal;
      workStarted.open();
      await new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason), { once: true }));
      return { value: "never", chargeUnits: 1 };
    });
    await workStarted.opened;
    caller.abort(new Error("client closed the connection"));
    expect(reasonOf(await running.catch((err: unknown) => err))).toBe("CANCELLED");
    expect(workSignal?.aborted).toBe(true);
    expect(await row(accountId)).toMatchObject({ balance: 32_000, reserved: 0, in_flight: 0 });
    await assertInvariants(database.db, accountId);
  });

  it("work that outlives its lease is not billed and not answered (late settle)", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 32_000 });
    let clock = new Date("2032-01-01T00:00:00.583Z"); // not on a whole second
    const lateMeter = createMeter({ db: database.db, config: metering, logger: createLogger("silent"), now: () => clock });
    const failure = await lateMeter
      .run(call(apiKey, { freeAllowed: false, timeoutMs: 1_000 }), async () => {
        clock = new Date(clock.getTime() + 1_000 + metering.leaseMarginMs + 1);
        return { value: "too late", chargeUnits: 5_000 };
      })
      .catch((err: unknown) => err);
    expect(reasonOf(failure)).toBe("UNAVAILABLE");
    expect(lateMeter.stats().lateSettles).toBe(1);
    expect(await row(accountId)).toMatchObject({ balance: 32_000, reserved: 0, in_flight: 0 });
    await assertInvariants(database.db, accountId);
  });

  it("graceful shutdown releases the holds of calls still running and refuses new ones", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 5 * 32_000 });
    const stoppingMeter = createMeter({ db: database.db, config: metering, logger: createLogger("silent") });
    const upstream = gate();
    const entered = gate();
    const running = stoppingMeter.run(call(apiKey, { freeAllowed: false }), async () => {
      entered.open();
      await upstream.opened;
      return { value: "late", chargeUnits: 1_000 };
    });
    await entered.opened;
    await stoppingMeter.releaseAll();
    expect(await row(accountId)).toMatchObject({ reserved: 0, in_flight: 0 });
    upstream.open();
    expect(reasonOf(await running.catch((err: unknown) => err))).toBe("UNAVAILABLE");
    expect(reasonOf(await stoppingMeter.run(call(apiKey), async () => ({ value: 1, chargeUnits: 0 })).catch((e: unknown) => e))).toBe(
      "UNAVAILABLE",
    );
    expect((await row(accountId)).balance).toBe(5 * 32_000);
    await assertInvariants(database.db, accountId);
  });
});

describe("refusals", () => {
  it.each([
    ["a malformed key", "ts_live_nope"],
    ["a well-formed key that was never issued", generateApiKey()],
  ])("%s → UNAUTHENTICATED before any work", async (_name, key) => {
    let ran = false;
    const failure = await meter
      .run(call(key), async () => {
        ran = true;
        return { value: 1, chargeUnits: 0 };
      })
      .catch((err: unknown) => err);
    expect(reasonOf(failure)).toBe("UNAUTHENTICATED");
    expect(ran).toBe(false);
  });

  it("a 429 names the limit and carries the retry delay and rate state in its metadata", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 10 * 32_000 });
    const upstream = gate();
    const allIn = gate();
    let entered = 0;
    const holders = Array.from({ length: 5 }, () =>
      meter.run(call(apiKey), async () => {
        if (++entered === 5) allIn.open();
        await upstream.opened;
        return { value: 1, chargeUnits: 0 };
      }),
    );
    await allIn.opened;
    const refused = await meter.run(call(apiKey), async () => ({ value: 1, chargeUnits: 0 })).catch((err: unknown) => err);
    upstream.open();
    await Promise.all(holders);
    expect(describeError(refused).detail.metadata).toMatchObject({
      limit: "concurrent_requests",
      limit_value: "5",
      retry_after_seconds: "1",
      ratelimit_limit: "60",
      ratelimit_remaining: "55",
    });
  });
});
