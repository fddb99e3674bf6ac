import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateApiKey } from "../../src/keys/api-keys.js";
import { loadConfig } from "../../src/config.js";
import { createKnex } from "../../src/db/database.js";
import { describeError } from "../../src/errors.js";
import { createLogger } from "../../src/logger.js";
import { createMeter, type Meter, type MeterDeps } from "../../src/metering/meter.js";
import { unitsToCredits } from "../../src/units.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { assertInvariants } from "../support/invariants.js";
import { meteredCall as call } from "../support/metering.js";
import { waitFor } from "../support/wait.js";

/**
 * The rules of the meter that callers and operators read: what each refusal
 * says and carries, what is logged and counted, input checks before anything
 * is held, the sweeper, shutdown, and what an unreachable database answers.
 * Against the real database; the clock is moved by milliseconds, never to a
 * whole second.
 */
let database: TestDatabase;
const metering = loadConfig({}).metering;

beforeAll(async () => {
  database = await createTestDatabase(10, { sweepsEveryAccount: true });
});
afterAll(async () => {
  await database?.close();
});

type LogLine = { level: string; msg: string } & Record<string, unknown>;

/** A meter whose log lines are kept, for the tests that read them. */
function loggedMeter(extra: Partial<MeterDeps> = {}): { meter: Meter; lines: LogLine[] } {
  const lines: LogLine[] = [];
  const logger = createLogger("debug", {}, (line) => lines.push(JSON.parse(line) as LogLine));
  return { meter: createMeter({ db: database.db, config: metering, logger, ...extra }), lines };
}

const failureOf = (promise: Promise<unknown>) => promise.then(() => undefined, (err: unknown) => err);
const detailOf = (err: unknown) => describeError(err);
const rowsOf = (accountId: string) => database.db("requests").where({ account_id: accountId });
const accountRow = (accountId: string) => database.db("accounts").where({ id: accountId }).first();
const ok = async () => ({ value: "answer", chargeUnits: 1_000 });

/** Work that starts and then waits until the test calls `release`; `entered` resolves once it runs. */
function heldWork<T>(result: T) {
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  let enter!: () => void;
  const entered = new Promise<void>((resolve) => (enter = resolve));
  const work = async () => {
    enter();
    await held;
    return result;
  };
  return { work, entered, release };
}

describe("checks before anything is held", () => {
  it("a malformed key is refused by its shape, without a database round trip", async () => {
    const { meter } = loggedMeter();
    const failure = detailOf(await failureOf(meter.run(call("ts_live_nope"), ok)));
    expect(failure.reason).toBe("UNAUTHENTICATED");
    expect(failure.message).toBe("malformed API key: expected Authorization: Bearer ts_live_...");
    const unknown = detailOf(await failureOf(meter.run(call(generateApiKey()), ok)));
    expect(unknown.message).toBe("invalid API key: unknown or revoked");
  });

  it("a reservation of 0 is a valid call", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 0 });
    const { meter } = loggedMeter();
    const result = await meter.run(call(apiKey, { reserveUnits: 0, freeAllowed: false }), async () => ({ value: 1, chargeUnits: 0 }));
    expect(result.billing).toMatchObject({ reservedCredits: 0, chargedCredits: 0 });
    await assertInvariants(database.db, accountId);
  });

  it.each([
    ["empty", ""],
    ["256 characters", "k".repeat(256)],
  ])("an Idempotency-Key that is %s is INVALID_ARGUMENT naming the header, nothing held", async (_name, idempotencyKey) => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 32_000 });
    const { meter } = loggedMeter();
    const failure = detailOf(await failureOf(meter.run(call(apiKey, { idempotencyKey, requestFingerprint: "{}" }), ok)));
    expect(failure.reason).toBe("INVALID_ARGUMENT");
    expect(failure.message).toBe("Idempotency-Key must be 1 to 255 characters");
    expect(failure.detail).toMatchObject({ field: "idempotency_key", rule: "length" });
    expect(await rowsOf(accountId)).toHaveLength(0);
  });

  it("an Idempotency-Key of 1 and of 255 characters is accepted", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 100_000 });
    const { meter } = loggedMeter();
    for (const idempotencyKey of ["k", "k".repeat(255)]) {
      const result = await meter.run(call(apiKey, { idempotencyKey, requestFingerprint: "{}" }), ok);
      expect(result.kind).toBe("fresh");
    }
  });

  it("a caller already gone is CANCELLED before admission: no row, no rate slot", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 32_000 });
    const { meter } = loggedMeter();
    const caller = new AbortController();
    caller.abort(new Error("client closed the connection"));
    let ran = false;
    const failure = detailOf(
      await failureOf(
        meter.run(call(apiKey, { signal: caller.signal }), async () => {
          ran = true;
          return { value: 1, chargeUnits: 0 };
        }),
      ),
    );
    expect(failure.reason).toBe("CANCELLED");
    expect(failure.message).toBe("the caller cancelled the call; nothing was charged");
    expect(ran).toBe(false);
    expect(await rowsOf(accountId)).toHaveLength(0);
  });
});

describe("the billing record's id", () => {
  it("is the call's request id when that is a UUID, and a fresh one otherwise (a prefix or suffix is not a UUID)", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 100_000 });
    const { meter } = loggedMeter();
    const uuid = crypto.randomUUID();
    expect((await meter.run(call(apiKey, { requestId: uuid }), ok)).billing.requestId).toBe(uuid);
    for (const requestId of [`x${crypto.randomUUID()}`, `${crypto.randomUUID()}x`]) {
      const billed = (await meter.run(call(apiKey, { requestId }), ok)).billing.requestId;
      expect(billed).not.toBe(requestId);
      expect(billed).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    }
    expect((await rowsOf(accountId)).map((r: { id: string }) => r.id)).toContain(uuid);
  });
});

describe("refusals say what happened and carry the numbers", () => {
  it("402 names the reservation and the available amount, in credits and units, and the rate state", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 1_500 });
    const { meter } = loggedMeter();
    const failure = detailOf(await failureOf(meter.run(call(apiKey, { reserveUnits: 32_000, freeAllowed: false }), ok)));
    expect(failure.reason).toBe("INSUFFICIENT_BALANCE");
    expect(failure.message).toBe(`insufficient balance: this call reserves ${unitsToCredits(32_000)} credits, ${unitsToCredits(1_500)} available`);
    expect(failure.detail.metadata).toEqual({
      required_credits: String(unitsToCredits(32_000)),
      available_credits: String(unitsToCredits(1_500)),
      required_units: "32000",
      available_units: "1500",
      free_requests_remaining: "0",
      ratelimit_limit: "60",
      ratelimit_remaining: "60",
      ratelimit_reset_seconds: "0",
    });
  });

  it("the 61st call in a minute is RATE_LIMITED with the wait, in seconds and ms", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 10_000_000 });
    const clock = new Date("2031-03-04T05:06:07.250Z");
    const { meter } = loggedMeter({ now: () => clock });
    for (let i = 0; i < 60; i++) await meter.run(call(apiKey), async () => ({ value: i, chargeUnits: 0 }));
    const failure = detailOf(await failureOf(meter.run(call(apiKey), ok)));
    expect(failure.reason).toBe("RATE_LIMITED");
    expect(failure.message).toBe("rate limit: at most 60 calls per rolling minute; retry in 60 s");
    expect(failure.detail.metadata).toEqual({
      limit: "requests_per_minute",
      limit_value: "60",
      retry_after_seconds: "60",
      retry_after_ms: "60000",
      ratelimit_limit: "60",
      ratelimit_remaining: "0",
      ratelimit_reset_seconds: "60",
    });
  });

  it("the 6th call in flight is CONCURRENCY_LIMITED, with the limit in its message", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 10_000_000 });
    const { meter } = loggedMeter();
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let entered = 0;
    let allIn!: () => void;
    const allEntered = new Promise<void>((resolve) => (allIn = resolve));
    const holders = Array.from({ length: 5 }, () =>
      meter.run(call(apiKey), async () => {
        if (++entered === 5) allIn();
        await held;
        return { value: 1, chargeUnits: 0 };
      }),
    );
    await allEntered;
    const failure = detailOf(await failureOf(meter.run(call(apiKey), ok)));
    release();
    await Promise.all(holders);
    expect(failure.reason).toBe("CONCURRENCY_LIMITED");
    expect(failure.message).toBe("concurrency limit: at most 5 calls in flight; retry in 1 s");
  });

  it("an Idempotency-Key in flight is 409 and with another body 422, naming the key and the first request", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 10_000_000 });
    const { meter } = loggedMeter();
    const first = call(apiKey, { idempotencyKey: "order-7", requestFingerprint: '{"q":1}' });
    const { work, entered, release } = heldWork({ value: "first", chargeUnits: 700, responseJson: { answer: "first" } });
    const running = meter.run(first, work);
    await entered;
    const inProgress = detailOf(await failureOf(meter.run({ ...first, requestId: crypto.randomUUID() }, ok)));
    release();
    const settled = await running;
    expect(inProgress.reason).toBe("IDEMPOTENCY_IN_PROGRESS");
    expect(inProgress.message).toBe("a request with this Idempotency-Key is still in flight; retry after it completes");
    expect(inProgress.detail).toMatchObject({ field: "idempotency_key", rule: "one call at a time per key" });
    expect(inProgress.detail.metadata["original_request_id"]).toBe(settled.billing.requestId);
    expect(inProgress.detail.metadata["ratelimit_limit"]).toBe("60");

    const mismatch = detailOf(await failureOf(meter.run({ ...first, requestId: crypto.randomUUID(), requestFingerprint: '{"q":2}' }, ok)));
    expect(mismatch.reason).toBe("IDEMPOTENCY_MISMATCH");
    expect(mismatch.message).toBe("this Idempotency-Key was used with a different request");
    expect(mismatch.detail).toMatchObject({ field: "idempotency_key", rule: "a key stands for one request body" });
    expect(mismatch.detail.metadata["original_request_id"]).toBe(settled.billing.requestId);

    let ranAgain = false;
    const replay = await meter.run({ ...first, requestId: crypto.randomUUID() }, async () => {
      ranAgain = true;
      return { value: "again", chargeUnits: 700 };
    });
    expect(ranAgain).toBe(false);
    expect(replay).toMatchObject({ kind: "replay", responseJson: { answer: "first" } });
    expect(replay.billing).toMatchObject({ requestId: settled.billing.requestId, chargedCredits: unitsToCredits(700), funding: "paid" });
    expect(replay.rate.limit).toBe(60);
  });

  it("a replay reports the account as the original's settle left it, though later calls moved every figure", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 10_000_000, freeRequests: 2 });
    const { meter } = loggedMeter();
    const original = call(apiKey, { idempotencyKey: "invoice-9", requestFingerprint: '{"q":9}' });
    const first = await meter.run(original, async () => ({ value: "first", chargeUnits: 700, responseJson: { answer: "first" } }));
    // The second free request, then a paid charge, then a hold in flight: balance, free requests and available balance all move.
    await meter.run(call(apiKey), async () => ({ value: "free", chargeUnits: 300 }));
    await meter.run(call(apiKey), async () => ({ value: "paid", chargeUnits: 2_500 }));
    const { work, entered, release } = heldWork({ value: "held", chargeUnits: 100 });
    const held = meter.run(call(apiKey), work);
    await entered;

    const replay = await meter.run({ ...original, requestId: crypto.randomUUID() }, ok);
    release();
    await held;
    expect(first.billing).toMatchObject({ funding: "free", balanceCredits: 10, availableCredits: 10, freeRequestsRemaining: 1 });
    expect(replay).toMatchObject({ kind: "replay", responseJson: { answer: "first" } });
    expect(replay.billing).toEqual(first.billing);
    expect(await accountRow(accountId)).toMatchObject({ balance: 10_000_000 - 2_500 - 100, free_remaining: 0 });
    await assertInvariants(database.db, accountId);
  });

  it("the stored answer is the work's JSON only with a key; a call without one stores nothing", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 10_000_000 });
    const { meter } = loggedMeter();
    await meter.run(call(apiKey), async () => ({ value: 1, chargeUnits: 0, responseJson: { kept: false } }));
    await meter.run(call(apiKey, { idempotencyKey: "no-json", requestFingerprint: "{}" }), async () => ({ value: 1, chargeUnits: 0 }));
    const rows = (await rowsOf(accountId)) as { idempotency_key: string | null; response: unknown }[];
    expect(rows.map((r) => [r.idempotency_key, r.response])).toEqual(
      expect.arrayContaining([
        [null, null],
        ["no-json", null],
      ]),
    );
  });

  it("a key without a fingerprint is admitted (nothing to compare)", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 10_000_000 });
    const { meter } = loggedMeter();
    expect((await meter.run(call(apiKey, { idempotencyKey: "bare" }), ok)).kind).toBe("fresh");
  });
});

describe("what operators see", () => {
  it("a late settle is logged with the hold's status and answered 503 not billed", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 32_000 });
    let clock = new Date("2032-01-01T00:00:00.125Z");
    const { meter, lines } = loggedMeter({ now: () => clock });
    const failure = detailOf(
      await failureOf(
        meter.run(call(apiKey, { freeAllowed: false, timeoutMs: 1_000 }), async () => {
          clock = new Date(clock.getTime() + 1_000 + metering.leaseMarginMs + 1);
          return { value: "too late", chargeUnits: 5_000 };
        }),
      ),
    );
    expect(failure.message).toBe("the call outlived its reservation and was not billed; retry");
    const warned = lines.find((line) => line.msg === "late settle: the hold was no longer active; answer withheld");
    expect(warned).toMatchObject({ level: "warn", outcome: "not_active", status: "expired", account_id: accountId, endpoint: "decide" });
    expect(meter.stats()).toMatchObject({ lateSettles: 1, settles: 0, holdsInFlight: 0 });
  });

  it("a capped charge is logged with the actual and the reserved units", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 32_000 });
    const { meter, lines } = loggedMeter();
    await meter.run(call(apiKey, { reserveUnits: 1_000, freeAllowed: false }), async () => ({ value: 1, chargeUnits: 1_500 }));
    expect(lines.find((line) => line.msg === "actual cost above the reservation; charged the reservation")).toMatchObject({
      level: "warn",
      actual_units: 1_500,
      reserved_units: 1_000,
    });
    expect(meter.stats()).toMatchObject({ cappedCharges: 1, settles: 1 });
  });

  it("counts settles and releases, and no hold stays in flight after either", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 100_000 });
    const { meter } = loggedMeter();
    await meter.run(call(apiKey), ok);
    await failureOf(meter.run(call(apiKey), async () => Promise.reject(new Error("upstream failed"))));
    expect(meter.stats()).toEqual({
      holdsInFlight: 0,
      settles: 1,
      releases: 1,
      holdsExpired: 0,
      lateSettles: 0,
      settleFailures: 0,
      releaseFailures: 0,
      admissionsAbandoned: 0,
      cappedCharges: 0,
    });
  });

  it("holds in flight count the calls whose work is running", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 100_000 });
    const { meter } = loggedMeter();
    const { work, entered, release } = heldWork({ value: 1, chargeUnits: 0 });
    const running = meter.run(call(apiKey), work);
    await entered;
    expect(meter.stats().holdsInFlight).toBe(1);
    release();
    await running;
    expect(meter.stats().holdsInFlight).toBe(0);
  });
});

describe("the sweeper", () => {
  it("sweepNow releases expired holds, counts and logs them; with nothing expired it neither counts nor logs", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 64_000 });
    let clock = new Date("2033-05-06T07:08:09.375Z");
    const { meter, lines } = loggedMeter({ now: () => clock });
    // A hold whose work never returns within the test: its lease lapses on the moved clock.
    const { work, entered, release } = heldWork({ value: 1, chargeUnits: 0 });
    const stuck = meter.run(call(apiKey, { freeAllowed: false, timeoutMs: 1_000 }), work);
    await entered;
    expect(await meter.sweepNow()).toBe(0);
    expect(meter.stats().holdsExpired).toBe(0);
    expect(lines.filter((line) => line.msg === "released expired holds")).toEqual([]);

    clock = new Date(clock.getTime() + 1_000 + metering.leaseMarginMs + 1);
    expect(await meter.sweepNow()).toBe(1);
    expect(meter.stats().holdsExpired).toBe(1);
    expect(lines.filter((line) => line.msg === "released expired holds")).toEqual([expect.objectContaining({ level: "warn", expired: 1 })]);
    expect(await accountRow(accountId)).toMatchObject({ reserved: 0, in_flight: 0 });
    release();
    await failureOf(stuck);
    await assertInvariants(database.db, accountId);
  });

  it("startSweeper sweeps on its interval (started twice, one timer) until stop", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 64_000 });
    let clock = new Date("2034-01-02T03:04:05.625Z");
    const lines: LogLine[] = [];
    const meter = createMeter({
      db: database.db,
      config: { ...metering, sweepIntervalMs: 20 },
      logger: createLogger("debug", {}, (line) => lines.push(JSON.parse(line) as LogLine)),
      now: () => clock,
    });
    const { work, entered, release } = heldWork({ value: 1, chargeUnits: 0 });
    const stuck = meter.run(call(apiKey, { freeAllowed: false, timeoutMs: 1_000 }), work);
    await entered;
    clock = new Date(clock.getTime() + 1_000 + metering.leaseMarginMs + 1);
    meter.startSweeper();
    meter.startSweeper();
    await waitFor(() => meter.stats().holdsExpired === 1, "the sweeper to expire the hold");
    await meter.stop();
    expect(lines.filter((line) => line.msg === "released expired holds")).toHaveLength(1);
    expect(await accountRow(accountId)).toMatchObject({ reserved: 0, in_flight: 0 });
    release();
    await failureOf(stuck);
  });
});

describe("the sweeper under a failing database", () => {
  it("a failing sweep is logged and the next one runs", async () => {
    // Nothing listens on port 1 of the loopback: every sweep fails at once.
    const unreachable = createKnex("postgres://postgres@127.0.0.1:1/none", 1);
    const lines: LogLine[] = [];
    const meter = createMeter({
      db: unreachable,
      config: { ...metering, sweepIntervalMs: 20 },
      logger: createLogger("debug", {}, (line) => lines.push(JSON.parse(line) as LogLine)),
    });
    try {
      meter.startSweeper();
      await waitFor(() => lines.filter((line) => line.msg === "sweep failed").length >= 2, "two failed sweeps");
      expect(lines.find((line) => line.msg === "sweep failed")).toMatchObject({ level: "warn", err: expect.any(Object) });
    } finally {
      await meter.stop();
      await unreachable.destroy();
    }
  });
});

describe("errors that are not the database's", () => {
  it("an admission the database refuses (not unreachable) is an error of its own, not a 503, and nothing is released", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 32_000 });
    const { meter } = loggedMeter();
    const failure = await failureOf(meter.run(call(apiKey, { endpoint: "bogus" as never }), ok));
    expect(detailOf(failure).reason).toBe("INTERNAL");
    expect(String((failure as Error).message)).toContain("unknown endpoint");
    expect(meter.stats()).toMatchObject({ releases: 0, releaseFailures: 0 });
  });

  it("a cancel carries the caller's reason as its cause", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 32_000 });
    const { meter } = loggedMeter();
    const caller = new AbortController();
    const reason = new Error("client closed the connection");
    caller.abort(reason);
    const failure = await failureOf(meter.run(call(apiKey, { signal: caller.signal }), ok));
    expect((failure as Error).cause).toBe(reason);
  });
});

describe("shutdown", () => {
  it("after beginShutdown a new call is UNAVAILABLE with a 1 s retry, and nothing is held", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 32_000 });
    const { meter } = loggedMeter();
    meter.beginShutdown();
    const failure = detailOf(await failureOf(meter.run(call(apiKey), ok)));
    expect(failure.reason).toBe("UNAVAILABLE");
    expect(failure.message).toBe("the server is shutting down; retry");
    expect(failure.detail.metadata).toEqual({ retry_after_seconds: "1" });
    expect(await rowsOf(accountId)).toHaveLength(0);
  });

  it("a call whose caller left while the server stops is answered as a shutdown, not a cancel", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 32_000 });
    const { meter } = loggedMeter();
    const caller = new AbortController();
    const failure = detailOf(
      await failureOf(
        meter.run(call(apiKey, { signal: caller.signal }), async (signal) => {
          meter.beginShutdown();
          caller.abort(new Error("server shutting down"));
          throw signal.reason;
        }),
      ),
    );
    expect(failure.message).toBe("the server is shutting down; retry");
    expect(await accountRow(accountId)).toMatchObject({ reserved: 0, in_flight: 0 });
  });
});

describe("a database that cannot be reached", () => {
  it("admission fails: 503 not billed; the release attempt fails too and is counted and logged", async () => {
    // Nothing listens on port 1 of the loopback: every connection is refused at once.
    const unreachable = createKnex("postgres://postgres@127.0.0.1:1/none", 1);
    const lines: LogLine[] = [];
    const meter = createMeter({
      db: unreachable,
      config: metering,
      logger: createLogger("debug", {}, (line) => lines.push(JSON.parse(line) as LogLine)),
      settleRetryDelaysMs: [1],
    });
    try {
      const failure = detailOf(await failureOf(meter.run(call(generateApiKey(), { endpoint: "search", freeAllowed: false }), ok)));
      expect(failure.reason).toBe("UNAVAILABLE");
      expect(failure.message).toBe("the database is unreachable; the call was not billed; retry later");
      expect(meter.stats()).toMatchObject({ releaseFailures: 1, releases: 0, holdsInFlight: 0 });
      expect(lines.find((line) => line.msg === "release failed; the lease will release the hold")).toMatchObject({ level: "warn", endpoint: "search", err: expect.any(Object) });
    } finally {
      await unreachable.destroy();
    }
  });
});
