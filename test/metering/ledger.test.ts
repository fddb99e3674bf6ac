import crypto from "node:crypto";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashApiKey } from "../../src/keys/api-keys.js";
import { revokeApiKey } from "../../src/keys/store.js";
import { createKnex } from "../../src/db/database.js";
import { createBatcher } from "../../src/db/statement-batcher.js";
import {
  abandon,
  admit,
  admitMany,
  grant,
  isPGlite,
  prepareStatementsOn,
  finish,
  finishMany,
  sweep,
  type Admission,
  type AdmitInput,
} from "../../src/metering/ledger.js";
import { decisionReserveUnits, searchReserveUnits } from "../../src/metering/meter.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { assertInvariants } from "../support/invariants.js";

/**
 * The metering functions, driven one round trip at a time with an injected
 * clock (`now`): the deterministic half of the metering tests (the racing
 * half runs calls concurrently). Every test ends with the invariants.
 */
let database: TestDatabase;
beforeAll(async () => {
  database = await createTestDatabase(10, { sweepsEveryAccount: true });
});
afterAll(async () => {
  await database?.close();
});

const T0 = new Date("2031-03-01T12:00:00.417Z"); // not on a whole second
const at = (ms: number) => new Date(T0.getTime() + ms);
const LEASE_MS = 90_000;

async function account(init: { units?: number; freeRequests?: number } = {}) {
  const created = await createTestAccount(database.db, init);
  const keyHash = hashApiKey(created.apiKey);
  const call = (input: Partial<AdmitInput> = {}): Promise<Admission> =>
    admit(database.db, {
      keyHash,
      endpoint: "decide",
      reserveUnits: decisionReserveUnits(1),
      freeAllowed: true,
      leaseMs: LEASE_MS,
      now: T0,
      ...input,
    });
  const row = () => database.db("accounts").where({ id: created.accountId }).first();
  return { ...created, call, row, check: () => assertInvariants(database.db, created.accountId) };
}

function admitted(admission: Admission) {
  if (admission.outcome !== "admitted") throw new Error(`expected an admission, got ${admission.outcome}`);
  return admission;
}

describe("reserve math (A1)", () => {
  it.each([
    [1, 32_000],
    [40, 1_280_000],
  ])("a decision with %i question(s) holds %i units", async (questions, units) => {
    expect(decisionReserveUnits(questions)).toBe(units);
    const a = await account({ units: 2_000_000 });
    const hold = admitted(await a.call({ reserveUnits: decisionReserveUnits(questions), freeAllowed: false }));
    expect(hold.reservedUnits).toBe(units);
    expect((await a.row()).reserved).toBe(units);
    await a.check();
  });

  it("a search holds the price of every source it could query, never a free request", async () => {
    const everySource = [{ priceUnits: 1_000 }, { priceUnits: 2_500 }, { priceUnits: 0 }, { priceUnits: 500 }];
    const requested = everySource.slice(0, 2);
    expect(searchReserveUnits(everySource)).toBe(4_000);
    expect(searchReserveUnits(requested)).toBe(3_500);

    const a = await account({ units: 10_000, freeRequests: 3 });
    const all = admitted(await a.call({ endpoint: "search", reserveUnits: searchReserveUnits(everySource) }));
    const some = admitted(await a.call({ endpoint: "search", reserveUnits: searchReserveUnits(requested), now: at(1) }));
    expect([all.funding, all.reservedUnits, some.funding, some.reservedUnits]).toEqual(["paid", 4_000, "paid", 3_500]);
    expect(await a.row()).toMatchObject({ reserved: 7_500, free_reserved: 0 });
    await a.check();
  });
});

describe("funding order (A2)", () => {
  it("free, free, paid, then 402 — and a failed free call gives its free request back", async () => {
    const a = await account({ units: decisionReserveUnits(1), freeRequests: 2 });
    const outcomes: string[] = [];
    const attempt = async (success: boolean, i: number) => {
      const admission = await a.call({ now: at(i * 1000) });
      if (admission.outcome !== "admitted") return outcomes.push(admission.outcome);
      outcomes.push(admission.funding);
      const resolution = await finish(database.db, { requestId: admission.requestId, success, actualUnits: 10_000, now: at(i * 1000 + 10) });
      expect(resolution.outcome).toBe(success ? "settled" : "released");
    };
    await attempt(false, 0);
    for (let i = 1; i <= 4; i++) await attempt(true, i);

    expect(outcomes).toEqual(["free", "free", "free", "paid", "insufficient_balance"]);
    expect(await a.row()).toMatchObject({ balance: 22_000, reserved: 0, free_remaining: 0, free_reserved: 0, in_flight: 0 });
    await a.check();
  });

  it("402 reports the available amount and consumes nothing", async () => {
    const a = await account({ units: 40_000 });
    admitted(await a.call({ freeAllowed: false }));
    const before = await a.row();
    const refused = await a.call({ freeAllowed: false, now: at(1) });
    expect(refused).toMatchObject({ outcome: "insufficient_balance", requiredUnits: 32_000, availableUnits: 8_000 });
    expect(await a.row()).toEqual(before);
    await a.check();
  });

  it("an actual cost above the reservation is charged at the reservation (A8)", async () => {
    const a = await account({ units: 100_000 });
    const hold = admitted(await a.call({ freeAllowed: false }));
    const settled = await finish(database.db, { requestId: hold.requestId, success: true, actualUnits: 50_000, now: at(5) });
    expect(settled).toMatchObject({ outcome: "settled", chargedUnits: 32_000, capped: true, balanceUnits: 68_000 });
    await a.check();
  });

  it("resolves at most once: a second settle or release changes nothing", async () => {
    const a = await account({ units: 100_000 });
    const hold = admitted(await a.call({ freeAllowed: false }));
    await finish(database.db, { requestId: hold.requestId, success: true, actualUnits: 1_000, now: at(5) });
    const again = await finish(database.db, { requestId: hold.requestId, success: true, actualUnits: 9_000, now: at(6) });
    const release = await finish(database.db, { requestId: hold.requestId, success: false, now: at(7) });
    expect([again.outcome, release.outcome]).toEqual(["not_active", "not_active"]);
    expect(await a.row()).toMatchObject({ balance: 99_000, reserved: 0, in_flight: 0 });
    await a.check();
  });

  it("a settle asked again reports the account as that settle left it, not as later calls of the account left it", async () => {
    const a = await account({ units: 100_000, freeRequests: 2 });
    const first = admitted(await a.call({ freeAllowed: false }));
    const free = admitted(await a.call({ now: at(1) }));
    const settled = await finish(database.db, { requestId: first.requestId, success: true, actualUnits: 1_000, now: at(5) });
    const left = { balanceUnits: 99_000, availableUnits: 99_000, freeRemaining: 2, freeAvailable: 1 };
    expect(settled).toMatchObject({ outcome: "settled", ...left });

    // Later entries of the account: a paid call settles, the free call settles, a grant, a call holding credits.
    const later = admitted(await a.call({ freeAllowed: false, now: at(6) }));
    await finish(database.db, { requestId: later.requestId, success: true, actualUnits: 4_000, now: at(7) });
    await finish(database.db, { requestId: free.requestId, success: true, now: at(8) });
    await grant(database.db, { accountId: a.accountId, units: 10_000, freeRequests: 0, now: at(8) });
    const holding = admitted(await a.call({ freeAllowed: false, now: at(9) }));

    for (const success of [true, false]) {
      expect(await finish(database.db, { requestId: first.requestId, success, actualUnits: 1_000, now: at(10) })).toMatchObject({
        outcome: "not_active",
        status: "settled",
        chargedUnits: 1_000,
        ...left,
      });
    }
    expect(await a.row()).toMatchObject({ balance: 105_000, reserved: 32_000, free_remaining: 1, free_reserved: 0 });

    // A release asked again reports the account as the release left it.
    const released = await finish(database.db, { requestId: holding.requestId, success: false, now: at(11) });
    const afterRelease = { balanceUnits: 105_000, availableUnits: 105_000, freeRemaining: 1, freeAvailable: 1 };
    expect(released).toMatchObject({ outcome: "released", ...afterRelease });
    const paid = admitted(await a.call({ freeAllowed: false, now: at(12) }));
    await finish(database.db, { requestId: paid.requestId, success: true, actualUnits: 500, now: at(13) });
    expect(await finish(database.db, { requestId: holding.requestId, success: false, now: at(14) })).toMatchObject({
      outcome: "not_active",
      status: "released",
      ...afterRelease,
    });
    await a.check();
  });
});

describe("rolling-minute rate limit (A3)", () => {
  it("admits 60 in a window, refuses the 61st with the exact wait, admits again after the window", async () => {
    const a = await account({ units: 100 * 32_000 });
    for (let i = 0; i < 60; i++) {
      const hold = admitted(await a.call({ freeAllowed: false, now: at(i * 100) }));
      await finish(database.db, { requestId: hold.requestId, success: true, actualUnits: 1, now: at(i * 100 + 1) });
    }
    // The oldest admission (T0) leaves the window at T0 + 60 s.
    const refused = await a.call({ freeAllowed: false, now: at(59_900) });
    expect(refused).toMatchObject({ outcome: "rate_limited", retryAfterMs: 100, rateRemaining: 0 });
    expect(await a.call({ freeAllowed: false, now: at(59_999) })).toMatchObject({ outcome: "rate_limited", retryAfterMs: 1 });
    // The window is the 60 s before now, open at its start: T0 is out of it at T0 + 60 s.
    const after = admitted(await a.call({ freeAllowed: false, now: at(60_000) }));
    expect(after.rateRemaining).toBe(0);
    await finish(database.db, { requestId: after.requestId, success: false, now: at(60_002) });
    // The next slot frees when the second admission (T0 + 100 ms) leaves.
    expect(await a.call({ freeAllowed: false, now: at(60_050) })).toMatchObject({ outcome: "rate_limited", retryAfterMs: 50 });
    expect((await a.row()).balance).toBe(100 * 32_000 - 60);
    await a.check();
  });
});

describe("concurrency limit (A4)", () => {
  it("refuses the 6th call in flight without using a rate slot, and admits once one finishes", async () => {
    const a = await account({ units: 10 * 32_000 });
    const holds = [];
    for (let i = 0; i < 5; i++) holds.push(admitted(await a.call({ freeAllowed: false, now: at(i) })));
    const sixth = await a.call({ freeAllowed: false, now: at(10) });
    expect(sixth).toMatchObject({ outcome: "concurrency_limited", inFlight: 5, maxInFlight: 5, rateRemaining: 55 });
    expect((await a.row()).recent).toHaveLength(5);

    await finish(database.db, { requestId: holds[0]!.requestId, success: true, actualUnits: 100, now: at(20) });
    admitted(await a.call({ freeAllowed: false, now: at(30) }));
    expect(await a.row()).toMatchObject({ in_flight: 5, recent: expect.any(Array) });
    expect((await a.row()).recent).toHaveLength(6);
    await a.check();
  });
});

describe("leases (A5)", () => {
  it("the sweeper expires a hold after its lease; a late settle is refused and charges nothing", async () => {
    // Ten days before the other tests' holds, so the (global) sweep sees only these.
    const at = (ms: number) => new Date(T0.getTime() - 10 * 86_400_000 + ms);
    const a = await account({ units: 100_000, freeRequests: 1 });
    const free = admitted(await a.call({ now: at(0) }));
    const paid = admitted(await a.call({ now: at(1) }));
    expect([free.funding, paid.funding]).toEqual(["free", "paid"]);

    expect(await sweep(database.db, { now: at(LEASE_MS - 1) })).toBe(0);
    expect(await sweep(database.db, { now: at(LEASE_MS + 1) })).toBe(2);
    const late = await finish(database.db, { requestId: paid.requestId, success: true, actualUnits: 5_000, now: at(LEASE_MS + 2) });
    expect(late).toMatchObject({ outcome: "not_active", status: "expired", chargedUnits: 0 });
    expect(await a.row()).toMatchObject({ balance: 100_000, reserved: 0, free_remaining: 1, free_reserved: 0, in_flight: 0 });
    await a.check();
  });

  it("the account's next admission expires its stale holds itself, with no sweeper", async () => {
    const a = await account({ units: 5 * 32_000 });
    for (let i = 0; i < 5; i++) admitted(await a.call({ freeAllowed: false, now: at(i) }));
    expect((await a.call({ freeAllowed: false, now: at(1_000) })).outcome).toBe("concurrency_limited");
    const next = admitted(await a.call({ freeAllowed: false, now: at(LEASE_MS + 10) }));
    expect(next).toMatchObject({ inFlight: 1, availableUnits: 4 * 32_000 });
    await a.check();
  });

  it("a lease ends at its expiry instant: an admission or a settle at that instant finds the hold expired", async () => {
    const reserve = decisionReserveUnits(1);
    const start = 250;
    const a = await account({ units: reserve });
    const hold = admitted(await a.call({ freeAllowed: false, now: at(start) }));
    // Every unit is held until the lease's last instant, and free from it on.
    expect((await a.call({ freeAllowed: false, now: at(start + LEASE_MS - 1) })).outcome).toBe("insufficient_balance");
    const next = admitted(await a.call({ freeAllowed: false, now: at(start + LEASE_MS) }));
    expect(next).toMatchObject({ inFlight: 1, availableUnits: 0 });

    const late = await finish(database.db, { requestId: next.requestId, success: true, actualUnits: 1, now: at(start + 2 * LEASE_MS) });
    expect(late).toMatchObject({ outcome: "not_active", status: "expired", chargedUnits: 0 });
    expect((await finish(database.db, { requestId: hold.requestId, success: true, now: at(start + 2 * LEASE_MS) })).outcome).toBe("not_active");
    expect(await a.row()).toMatchObject({ balance: reserve, reserved: 0, in_flight: 0 });
    await a.check();
  });
});

describe("idempotency keys (A6)", () => {
  const hash = (text: string) => hashApiKey(text);

  it("in flight → in progress; other body → mismatch; settled → replay without a second charge", async () => {
    const a = await account({ units: 100_000 });
    const key = { idempotencyKey: "order-42", requestHash: hash("body-1"), freeAllowed: false };
    const first = admitted(await a.call({ ...key, now: at(0) }));
    expect((await a.call({ ...key, now: at(1) })).outcome).toBe("idempotency_in_progress");
    const mismatch = await a.call({ ...key, requestHash: hash("body-2"), now: at(2) });
    expect(mismatch).toMatchObject({ outcome: "idempotency_mismatch", requestId: first.requestId });
    expect(mismatch).not.toHaveProperty("response");

    await finish(database.db, { requestId: first.requestId, success: true, actualUnits: 7_000, response: { answer: 42 }, now: at(3) });
    const replay = await a.call({ ...key, now: at(4) });
    expect(replay).toMatchObject({ outcome: "replay", requestId: first.requestId, chargedUnits: 7_000, response: { answer: 42 } });
    expect((await a.call({ ...key, requestHash: hash("body-2"), now: at(5) })).outcome).toBe("idempotency_mismatch");
    expect(await a.row()).toMatchObject({ balance: 93_000, in_flight: 0 });
    // Replays and refusals take no rate slot.
    expect((await a.row()).recent).toHaveLength(1);
    await a.check();
  });

  it("a failed call frees its key for a retry; a settled key is forgotten after 24 h", async () => {
    const a = await account({ units: 100_000 });
    const key = { idempotencyKey: "retry-me", requestHash: hash("body"), freeAllowed: false };
    const failed = admitted(await a.call({ ...key, now: at(0) }));
    await finish(database.db, { requestId: failed.requestId, success: false, now: at(1) });
    const retried = admitted(await a.call({ ...key, now: at(2) }));
    expect(retried.requestId).not.toBe(failed.requestId);
    await finish(database.db, { requestId: retried.requestId, success: true, actualUnits: 1_000, response: {}, now: at(3) });

    const dayLater = 24 * 3600 * 1000 + 10;
    expect((await a.call({ ...key, now: at(dayLater - 20) })).outcome).toBe("replay");
    const fresh = admitted(await a.call({ ...key, now: at(dayLater) }));
    expect(fresh.requestId).not.toBe(retried.requestId);
    await a.check();
  });
});

describe("keys (A7)", () => {
  it("a revoked key is refused from the next call on", async () => {
    const a = await account({ units: 100_000 });
    admitted(await a.call({ freeAllowed: false }));
    expect(await revokeApiKey(database.db, a.keyId)).toBe(true);
    expect(await a.call({ freeAllowed: false, now: at(1) })).toEqual({ outcome: "unauthenticated" });
    await a.check();
  });

  it("an unknown key is refused and touches no account", async () => {
    const refused = await admit(database.db, {
      keyHash: hashApiKey("ts_live_unknown"),
      endpoint: "decide",
      reserveUnits: 1,
      freeAllowed: true,
      leaseMs: 1_000,
    });
    expect(refused).toEqual({ outcome: "unauthenticated" });
  });
});

describe("answers of the ledger functions that callers branch on", () => {
  it("resolving a request id nobody admitted is not_found, and changes nothing", async () => {
    const requestId = crypto.randomUUID();
    expect(await finish(database.db, { requestId, success: true, actualUnits: 1, now: at(1) })).toEqual({ outcome: "not_found", requestId });
    expect(await finish(database.db, { requestId, success: false, now: at(2) })).toEqual({ outcome: "not_found", requestId });
  });

  it("capped only for a paid settle above the reservation: never a release, never a free call", async () => {
    const a = await account({ units: 100_000, freeRequests: 1 });
    const free = admitted(await a.call({ now: at(0) }));
    expect(free.funding).toBe("free");
    expect(await finish(database.db, { requestId: free.requestId, success: true, actualUnits: 50_000, now: at(1) })).toMatchObject({ outcome: "settled", capped: false, chargedUnits: 0 });
    const released = admitted(await a.call({ freeAllowed: false, now: at(2) }));
    expect(await finish(database.db, { requestId: released.requestId, success: false, now: at(3) })).toMatchObject({ outcome: "released", capped: false });
    const exact = admitted(await a.call({ freeAllowed: false, now: at(4) }));
    expect(await finish(database.db, { requestId: exact.requestId, success: true, actualUnits: 32_000, now: at(5) })).toMatchObject({ capped: false, chargedUnits: 32_000 });
    await a.check();
  });

  it("grant adds units and free requests to an account; an unknown account gets undefined", async () => {
    const a = await account({ units: 1_000, freeRequests: 2 });
    expect(await grant(database.db, { accountId: a.accountId, units: 500, freeRequests: 3, now: at(1) })).toEqual({
      accountId: a.accountId,
      balanceUnits: 1_500,
      reservedUnits: 0,
      freeRemaining: 5,
      freeReserved: 0,
    });
    expect(await grant(database.db, { accountId: crypto.randomUUID(), units: 500, freeRequests: 0, now: at(2) })).toBeUndefined();
    await a.check();
  });
});

describe("abandoned admissions (an admission whose reply was lost or late)", () => {
  const tombstone = (requestId: string) => database.db("abandoned_admissions").where({ request_id: requestId }).first();

  it("abandoning an admission that committed releases its hold, once", async () => {
    const a = await account({ units: 32_000, freeRequests: 1 });
    const requestId = crypto.randomUUID();
    admitted(await a.call({ requestId }));
    expect(await abandon(database.db, { requestId, now: at(5) })).toMatchObject({ outcome: "released", funding: "free", freeAvailable: 1 });
    expect(await abandon(database.db, { requestId, now: at(6) })).toMatchObject({ outcome: "not_active", status: "released" });
    expect(await a.row()).toMatchObject({ in_flight: 0, free_reserved: 0, free_remaining: 1 });
    expect(await tombstone(requestId)).toBeUndefined();
    await a.check();
  });

  it("an admission that arrives after its id was abandoned rolls itself back: nothing held, no slot taken", async () => {
    const a = await account({ units: 32_000 });
    const requestId = crypto.randomUUID();
    expect(await abandon(database.db, { requestId, now: at(-1) })).toEqual({ outcome: "not_found", requestId });
    expect(await tombstone(requestId)).toMatchObject({ abandoned_at: at(-1) });
    await expect(a.call({ requestId, freeAllowed: false })).rejects.toThrow(`request ${requestId} was abandoned by its caller`);
    expect(await database.db("requests").where({ id: requestId }).first()).toBeUndefined();
    expect(await a.row()).toMatchObject({ balance: 32_000, reserved: 0, in_flight: 0, recent: [] });
    // Another id of the same account is admitted as usual.
    admitted(await a.call({ freeAllowed: false, requestId: crypto.randomUUID() }));
    await a.check();
  });

  it("a record older than a day is dropped when a new one is written", async () => {
    const old = crypto.randomUUID();
    const recent = crypto.randomUUID();
    await abandon(database.db, { requestId: old, now: at(-86_400_001) });
    await abandon(database.db, { requestId: recent, now: at(-86_399_999) });
    const fresh = crypto.randomUUID();
    await abandon(database.db, { requestId: fresh, now: T0 });
    expect(await tombstone(old)).toBeUndefined();
    expect(await tombstone(recent)).toBeDefined();
    expect(await tombstone(fresh)).toBeDefined();
  });
});

describe("named statements", () => {
  it.each([
    // Recorded from PGlite 0.5.14 and Debian's PostgreSQL 15.
    ["PostgreSQL 18.6 (PGlite 0.5.14) on wasm32-unknown-emscripten, compiled by emcc (Emscripten gcc/clang-like replacement + linker emulating GNU ld) 6.0.5, 32-bit", true],
    ["PostgreSQL 15.20 (Debian 15.20-0+deb12u1) on x86_64-pc-linux-gnu, compiled by gcc (Debian 12.2.0-14+deb12u1) 12.2.0, 64-bit", false],
  ])("%s is PGlite: %s", (version, pglite) => {
    expect(isPGlite(version)).toBe(pglite);
  });

  it("on PostgreSQL admit and finish are prepared once per connection; on the embedded store (one shared session) never", async () => {
    const oneConnection = createKnex(database.url, 1);
    try {
      await prepareStatementsOn(oneConnection);
      const { apiKey } = await createTestAccount(database.db, { units: 100_000 });
      for (let i = 0; i < 2; i++) {
        const held = await admit(oneConnection, { keyHash: hashApiKey(apiKey), endpoint: "decide", reserveUnits: 1_000, freeAllowed: false, leaseMs: LEASE_MS });
        if (held.outcome !== "admitted") throw new Error(`not admitted: ${held.outcome}`);
        expect(await finish(oneConnection, { requestId: held.requestId, success: true, actualUnits: 10 })).toMatchObject({ outcome: "settled" });
      }
      const { rows } = await oneConnection.raw<{ rows: Array<{ name: string }> }>("SELECT name FROM pg_prepared_statements ORDER BY name");
      expect(rows.map((r) => r.name)).toEqual(database.isExternal ? ["metering_admit_v2", "metering_resolve_v2"] : []);
    } finally {
      await oneConnection.destroy();
    }
  });
});

describe("batches (admitMany, finishMany)", () => {
  const input = (a: { apiKey: string }, extra: Partial<AdmitInput> = {}): AdmitInput => ({
    keyHash: hashApiKey(a.apiKey),
    endpoint: "decide",
    reserveUnits: 1_000,
    freeAllowed: false,
    leaseMs: LEASE_MS,
    now: T0,
    requestId: crypto.randomUUID(),
    ...extra,
  });

  it("answers each call in the order sent; calls of one account see each other as consecutive calls would", async () => {
    const busy = await account({ units: 100_000 });
    const other = await account({ units: 100_000 });
    await database.db("accounts").where({ id: busy.accountId }).update({ max_in_flight: 1 });
    const inputs = [input(other), input(busy), input({ apiKey: `ts_live_${"x".repeat(38)}` }), input(busy, { now: at(1) })];
    const answers = await admitMany(database.db, inputs, undefined);
    expect(answers.map((a) => a.outcome)).toEqual(["admitted", "admitted", "unauthenticated", "concurrency_limited"]);
    expect(answers[0]).toMatchObject({ requestId: inputs[0]!.requestId, accountId: other.accountId, inFlight: 1 });
    expect(answers[1]).toMatchObject({ requestId: inputs[1]!.requestId, accountId: busy.accountId, inFlight: 1 });
    expect(answers[3]).toMatchObject({ accountId: busy.accountId, inFlight: 1, maxInFlight: 1 });
    await busy.check();
    await other.check();
  });

  it("settles, releases and reports an unknown request, each answer for its own request id", async () => {
    const a = await account({ units: 100_000 });
    const [first, second] = (await admitMany(database.db, [input(a), input(a)], undefined)).map(admitted);
    const unknown = crypto.randomUUID();
    const answers = await finishMany(
      database.db,
      [
        { requestId: second!.requestId, success: false, now: at(2) },
        { requestId: unknown, success: true, actualUnits: 5, now: at(2) },
        { requestId: first!.requestId, success: true, actualUnits: 300, now: at(2) },
      ],
      undefined,
    );
    expect(answers).toMatchObject([
      { outcome: "released", requestId: second!.requestId, chargedUnits: 0 },
      { outcome: "not_found", requestId: unknown },
      { outcome: "settled", requestId: first!.requestId, chargedUnits: 300, balanceUnits: 99_700 },
    ]);
    expect(await a.row()).toMatchObject({ balance: 99_700, reserved: 0, in_flight: 0 });
    await a.check();
  });

  it("sends a call alone through the single-call function (cheaper for PostgreSQL), calls together through the batch one", async () => {
    const a = await account({ units: 100_000 });
    const statements: string[] = [];
    const onQuery = (query: { sql: string }) => statements.push(query.sql);
    database.db.on("query", onQuery);
    try {
      const [alone] = (await admitMany(database.db, [input(a)], undefined)).map(admitted);
      const together = (await admitMany(database.db, [input(a), input(a)], undefined)).map(admitted);
      await finishMany(database.db, [{ requestId: alone!.requestId, success: true, actualUnits: 1, now: at(1) }], undefined);
      await finishMany(database.db, together.map((hold) => ({ requestId: hold.requestId, success: false, now: at(1) })), undefined);
    } finally {
      database.db.off("query", onQuery);
    }
    expect(statements.map((sql) => /metering_\w+/.exec(sql.replace("metering_admit_unless_abandoned_v2", "metering_admit_v2"))?.[0])).toEqual([
      "metering_admit_v2",
      "metering_admit_many_v2",
      "metering_resolve_v2",
      "metering_resolve_many_v2",
    ]);
    await a.check();
  });

  it("is all or nothing: a call the database refuses rolls its whole batch back", async () => {
    const a = await account({ units: 100_000 });
    const good = input(a);
    const refused = await admitMany(database.db, [good, input(a, { leaseMs: -5 })], undefined).catch((err: unknown) => err);
    expect(refused).toBeInstanceOf(pg.DatabaseError);
    expect(refused).toMatchObject({ code: "22023" });
    expect(await database.db("requests").where({ id: good.requestId }).first()).toBeUndefined();
    expect(await a.row()).toMatchObject({ reserved: 0, in_flight: 0 });
  });

  it("through createBatcher, the calls of a refused batch are sent again alone: only the refused one fails", async () => {
    const a = await account({ units: 100_000 });
    const sizes: number[] = [];
    const submit = createBatcher<AdmitInput, Admission>({
      run: (inputs) => {
        sizes.push(inputs.length);
        return admitMany(database.db, inputs, undefined);
      },
      maxBatch: 10,
      maxInFlight: 1,
      stallMs: 60_000,
    });
    const inputs = [input(a), input(a), input(a, { reserveUnits: -1 }), input(a)];
    const answers = await Promise.all(inputs.map((i) => submit(i).catch((err: unknown) => err)));
    expect(sizes).toEqual([1, 3, 1, 1, 1]);
    expect(answers.map((x) => (x instanceof Error ? (x as pg.DatabaseError).code : (x as Admission).outcome))).toEqual(["admitted", "admitted", "22023", "admitted"]);
    expect(await a.row()).toMatchObject({ reserved: 3_000, in_flight: 3 });
    await a.check();
  });
});
