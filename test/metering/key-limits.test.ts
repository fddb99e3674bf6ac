import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashApiKey } from "../../src/keys/api-keys.js";
import { NO_KEY_LIMITS, rollKey, setKeyLimits, type KeyLimits } from "../../src/keys/key-limits.js";
import { createApiKey } from "../../src/keys/store.js";
import { admit, finish, sweep, type Admission, type AdmitInput } from "../../src/metering/ledger.js";
import { decisionReserveUnits } from "../../src/metering/meter.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { assertInvariants } from "../support/invariants.js";

/**
 * A key's own limits at the store: the admission (metering_admit_v2) refuses
 * an expired key, an endpoint out of its scopes, a call past its rate limit or
 * past its budget, and the settle (metering_resolve_v2) charges its budget in
 * the same transaction as the account. Bursts run as Promise.all on a pool of
 * real PostgreSQL sessions; every test ends with the invariants, which include
 * "no key charged past its budget in any period" (I8).
 */
let database: TestDatabase;
beforeAll(async () => {
  database = await createTestDatabase(10, { sweepsEveryAccount: true });
});
afterAll(async () => {
  await database?.close();
});

const T0 = new Date("2031-03-05T23:59:00.250Z"); // a Wednesday, a minute before midnight UTC
const at = (ms: number) => new Date(T0.getTime() + ms);
const RESERVE = decisionReserveUnits(1);

async function keyWith(limits: Partial<KeyLimits>, init: { units?: number; freeRequests?: number } = {}) {
  const created = await createTestAccount(database.db, { units: init.units ?? 10_000_000, freeRequests: init.freeRequests ?? 0 });
  await database.db.transaction((tx) => setKeyLimits(tx, created.accountId, created.keyId, { ...NO_KEY_LIMITS, ...limits }));
  const keyHash = hashApiKey(created.apiKey);
  const call = (input: Partial<AdmitInput> = {}): Promise<Admission> =>
    admit(database.db, { keyHash, endpoint: "decide", reserveUnits: RESERVE, freeAllowed: true, leaseMs: 90_000, now: T0, requestId: crypto.randomUUID(), ...input });
  const key = () => database.db("api_keys").where({ id: created.keyId }).first();
  return { ...created, keyHash, call, key, check: () => assertInvariants(database.db, created.accountId) };
}

function admittedId(admission: Admission): string {
  if (admission.outcome !== "admitted") throw new Error(`expected admitted, got ${admission.outcome}`);
  return admission.requestId;
}

describe("budget", () => {
  it("5 concurrent calls: only those whose holds fit the budget are admitted, and no settle charges past it", async () => {
    // Room for two holds and a half: the third must be refused however the five interleave.
    const k = await keyWith({ budget: { units: Math.floor(RESERVE * 2.5), period: "day" } });
    const first = await Promise.all(Array.from({ length: 5 }, () => k.call()));
    const admitted = first.filter((a) => a.outcome === "admitted");
    expect(admitted).toHaveLength(2);
    expect(first.filter((a) => a.outcome === "key_budget_exceeded")).toHaveLength(3);
    const refused = first.find((a) => a.outcome === "key_budget_exceeded");
    expect(refused).toMatchObject({ requiredUnits: RESERVE, budget: { budgetUnits: Math.floor(RESERVE * 2.5), period: "day", spentUnits: 0, heldUnits: 2 * RESERVE } });
    // Settled concurrently at the full hold: spent 2 × RESERVE, half a hold left.
    await Promise.all(admitted.map((a) => finish(database.db, { requestId: admittedId(a), success: true, actualUnits: RESERVE, now: at(1) })));
    expect(await k.key()).toMatchObject({ budget_spent: 2 * RESERVE });
    const second = await Promise.all(Array.from({ length: 5 }, () => k.call({ now: at(2) })));
    expect(second.map((a) => a.outcome)).toEqual(Array(5).fill("key_budget_exceeded"));
    // A smaller call fits what is left; exactly one of five racing ones.
    const small = await Promise.all(Array.from({ length: 5 }, () => k.call({ now: at(3), reserveUnits: RESERVE / 2 })));
    expect(small.filter((a) => a.outcome === "admitted")).toHaveLength(1);
    await k.check();
  });

  it("bursts racing the settles of the burst before never charge a key past its budget, and the refusals are exactly the calls that did not fit", async () => {
    const budget = 7 * RESERVE + 1234;
    const k = await keyWith({ budget: { units: budget, period: "total" } });
    let open: string[] = [];
    for (let round = 0; round < 10; round++) {
      // Admissions read the key's spend while the previous round's settles write it.
      const settles = open.map((requestId, i) =>
        finish(database.db, { requestId, success: i % 3 !== 2, actualUnits: Math.floor(Math.random() * RESERVE * 1.5) }),
      );
      const [burst] = await Promise.all([Promise.all(Array.from({ length: 5 }, () => k.call({ now: undefined }))), Promise.all(settles)]);
      for (const refusal of burst.filter((a) => a.outcome === "key_budget_exceeded")) {
        const b = (refusal as Extract<Admission, { outcome: "key_budget_exceeded" }>).budget;
        expect(b.spentUnits + b.heldUnits + RESERVE).toBeGreaterThan(budget);
      }
      open = burst.filter((a) => a.outcome === "admitted").map(admittedId);
    }
    await Promise.all(open.map((requestId) => finish(database.db, { requestId, success: true, actualUnits: RESERVE })));
    const key = await k.key();
    expect(key.budget_spent).toBeLessThanOrEqual(budget);
    const settled = await database.db("requests").where({ key_id: k.keyId, status: "settled" }).sum({ charged: "charged" }).first();
    expect(Number(settled!.charged)).toBe(key.budget_spent);
    await k.check();
  });

  it("a new UTC day starts a new daily budget; a hold admitted before midnight is charged to the day it settles in", async () => {
    const k = await keyWith({ budget: { units: RESERVE, period: "day" } });
    const before = admittedId(await k.call());
    expect((await k.call()).outcome).toBe("key_budget_exceeded");
    // Settled one minute later, past midnight: it counts to the new day, which it fills.
    await finish(database.db, { requestId: before, success: true, actualUnits: RESERVE, now: at(60_000) });
    expect(await k.key()).toMatchObject({ budget_spent: RESERVE, budget_period_start: new Date("2031-03-06T00:00:00Z") });
    expect((await k.call({ now: at(61_000) })).outcome).toBe("key_budget_exceeded");
    expect((await k.call({ now: at(86_400_000 + 60_000) })).outcome).toBe("admitted");
    await k.check();
  });

  it("weeks start on Monday and months on the 1st, in UTC", async () => {
    for (const [period, next] of [
      ["week", new Date("2031-03-10T00:00:00Z")],
      ["month", new Date("2031-04-01T00:00:00Z")],
    ] as const) {
      const k = await keyWith({ budget: { units: RESERVE, period } });
      await finish(database.db, { requestId: admittedId(await k.call()), success: true, now: at(1) });
      expect((await k.call({ now: new Date(next.getTime() - 1) })).outcome).toBe("key_budget_exceeded");
      expect((await k.call({ now: next })).outcome).toBe("admitted");
      await k.check();
    }
  });

  it("a free request passes a spent budget (it costs no credits); a released or expired hold gives the budget back", async () => {
    const k = await keyWith({ budget: { units: RESERVE, period: "day" } }, { freeRequests: 1 });
    const free = await k.call();
    expect(free).toMatchObject({ outcome: "admitted", funding: "free" });
    const paid = admittedId(await k.call());
    expect((await k.call()).outcome).toBe("key_budget_exceeded");
    await finish(database.db, { requestId: paid, success: false, now: at(1) });
    const again = admittedId(await k.call({ now: at(2), leaseMs: 1_000 }));
    expect((await k.call({ now: at(3) })).outcome).toBe("key_budget_exceeded");
    // The hold's lease passes: the sweep (which knows nothing of keys) gives it back.
    expect(await sweep(database.db, { now: at(5_000) })).toBeGreaterThanOrEqual(1);
    expect((await database.db("requests").where({ id: again }).first()).status).toBe("expired");
    expect((await k.call({ now: at(5_001) })).outcome).toBe("admitted");
    await k.check();
  });

  it("a settle whose reply was lost and is sent again charges the key once", async () => {
    const k = await keyWith({ budget: { units: 3 * RESERVE, period: "total" } });
    const id = admittedId(await k.call());
    await finish(database.db, { requestId: id, success: true, actualUnits: RESERVE, now: at(1) });
    expect((await finish(database.db, { requestId: id, success: true, actualUnits: RESERVE, now: at(2) })).outcome).toBe("not_active");
    expect(await k.key()).toMatchObject({ budget_spent: RESERVE });
    await k.check();
  });

  it("a budget set later counts the period's earlier charges", async () => {
    const k = await keyWith({});
    await finish(database.db, { requestId: admittedId(await k.call({ now: new Date() })), success: true, actualUnits: 5_000 });
    await database.db.transaction((tx) => setKeyLimits(tx, k.accountId, k.keyId, { ...NO_KEY_LIMITS, budget: { units: 6_000, period: "month" } }));
    expect(await k.key()).toMatchObject({ budget_spent: 5_000 });
    expect((await k.call({ now: new Date(), reserveUnits: 1_001 })).outcome).toBe("key_budget_exceeded");
    expect((await k.call({ now: new Date(), reserveUnits: 1_000 })).outcome).toBe("admitted");
  });

  it("the previous release's admission neither checks nor counts a key's budget, but its holds count against the budget in this release's", async () => {
    const k = await keyWith({ budget: { units: RESERVE, period: "total" } });
    const { rows } = await database.db.raw(
      "SELECT (metering_admit_unless_abandoned(?, 'decide', ?, false, 90000, NULL, NULL, ?, NULL)).outcome",
      [k.keyHash, 2 * RESERVE, T0],
    );
    expect(rows[0].outcome).toBe("admitted");
    expect((await k.call({ reserveUnits: 1 })).outcome).toBe("key_budget_exceeded");
  });
});

describe("expiry, scopes and rate", () => {
  it("an expired key is refused at its expiry, before anything is held", async () => {
    const k = await keyWith({ expiresAt: at(10_000) });
    expect((await k.call({ now: at(9_999) })).outcome).toBe("admitted");
    expect(await k.call({ now: at(10_000) })).toEqual({ outcome: "key_expired", keyId: k.keyId, expiredAt: at(10_000) });
    await k.check();
  });

  it("a key scoped to decisions is refused on search, and the other way round", async () => {
    const decisions = await keyWith({ scopes: ["decisions"] });
    expect((await decisions.call({ endpoint: "search", freeAllowed: false })).outcome).toBe("key_scope_denied");
    expect((await decisions.call()).outcome).toBe("admitted");
    const search = await keyWith({ scopes: ["search"] });
    expect((await search.call()).outcome).toBe("key_scope_denied");
    expect((await search.call({ endpoint: "search", freeAllowed: false })).outcome).toBe("admitted");
  });

  it("a key's rate limit holds in any rolling minute under a burst, while another key of the account goes on", async () => {
    const k = await keyWith({ rateLimit: 3 });
    const burst = await Promise.all(Array.from({ length: 5 }, () => k.call({ reserveUnits: 1 })));
    expect(burst.filter((a) => a.outcome === "admitted")).toHaveLength(3);
    const refused = burst.find((a) => a.outcome === "key_rate_limited") as Extract<Admission, { outcome: "key_rate_limited" }>;
    expect(refused).toMatchObject({ rateLimit: 3, rateRemaining: 0, retryAfterMs: 60_000 });
    for (const a of burst.filter((b) => b.outcome === "admitted")) await finish(database.db, { requestId: admittedId(a), success: true, now: at(1) });
    const other = await createApiKey(database.db, k.accountId);
    expect((await admit(database.db, { keyHash: hashApiKey(other.apiKey), endpoint: "decide", reserveUnits: 1, freeAllowed: false, leaseMs: 90_000, now: at(2) })).outcome).toBe("admitted");
    expect((await k.call({ now: at(59_999), reserveUnits: 1 })).outcome).toBe("key_rate_limited");
    expect((await k.call({ now: at(60_001), reserveUnits: 1 })).outcome).toBe("admitted");
  });

  it("an admitted call of a rate-limited key reports the key's remaining calls when they are fewer than the account's", async () => {
    const k = await keyWith({ rateLimit: 2 });
    expect(await k.call({ reserveUnits: 1 })).toMatchObject({ outcome: "admitted", rateLimit: 2, rateRemaining: 1 });
  });
});

describe("roll", () => {
  it("the new key has the same limits and carries the period's spend; the old one stops at the chosen time", async () => {
    const k = await keyWith({ budget: { units: 2 * RESERVE, period: "total" }, scopes: ["decisions"], rateLimit: 10 });
    await finish(database.db, { requestId: admittedId(await k.call({ now: new Date() })), success: true, actualUnits: RESERVE });
    const now = new Date();
    const rolled = await database.db.transaction((tx) => rollKey(tx, k.accountId, k.keyId, { graceSeconds: 3600, now, createdBy: "owner@example.com" }));
    expect(rolled!.oldKey.expires_at).toEqual(new Date(now.getTime() + 3_600_000));
    expect(rolled!.newKey).toMatchObject({ scopes: ["decisions"], budget_units: 2 * RESERVE, budget_period: "total", rate_limit: 10, budget_spent: RESERVE, expires_at: null });
    const fresh = (input: Partial<AdmitInput>) =>
      admit(database.db, { keyHash: hashApiKey(rolled!.apiKey), endpoint: "decide", reserveUnits: RESERVE, freeAllowed: false, leaseMs: 90_000, ...input });
    expect((await fresh({ endpoint: "search" })).outcome).toBe("key_scope_denied");
    expect((await fresh({ reserveUnits: RESERVE + 1 })).outcome).toBe("key_budget_exceeded");
    expect((await k.call({ now: new Date(now.getTime() + 3_599_000), reserveUnits: 1 })).outcome).toBe("admitted");
    expect((await k.call({ now: new Date(now.getTime() + 3_600_000), reserveUnits: 1 })).outcome).toBe("key_expired");
  });

  it("a roll changes the rolled key only; an old key that expires before its grace keeps its sooner expiry, which the new key inherits", async () => {
    const now = new Date();
    const soon = new Date(now.getTime() + 600_000);
    const k = await keyWith({ expiresAt: soon, scopes: ["search"], rateLimit: 7 });
    const sibling = await createApiKey(database.db, k.accountId);
    const neighbour = await keyWith({});
    const rolled = await database.db.transaction((tx) => rollKey(tx, k.accountId, k.keyId, { graceSeconds: 3600, now, createdBy: "operator" }));
    expect(rolled!.oldKey.expires_at).toEqual(soon);
    expect(rolled!.newKey).toMatchObject({ expires_at: soon, scopes: ["search"], rate_limit: 7 });
    for (const id of [sibling.keyId, neighbour.keyId]) {
      expect(await database.db("api_keys").where({ id }).first("expires_at", "scopes", "rate_limit", "budget_units")).toEqual({
        expires_at: null,
        scopes: null,
        rate_limit: null,
        budget_units: null,
      });
    }
    const later = await keyWith({ expiresAt: new Date(now.getTime() + 86_400_000) });
    const rolledLater = await database.db.transaction((tx) => rollKey(tx, later.accountId, later.keyId, { graceSeconds: 60, now, createdBy: "operator" }));
    expect(rolledLater!.oldKey.expires_at).toEqual(new Date(now.getTime() + 60_000));
  });

  it("every scope is stored as NULL (all, as keys made before limits), and one scope as itself", async () => {
    const both = await keyWith({ scopes: ["search", "decisions"] });
    expect((await both.key()).scopes).toBeNull();
    const one = await keyWith({ scopes: ["decisions"] });
    expect((await one.key()).scopes).toEqual(["decisions"]);
  });

  it("a roll with no grace stops the old key at once; a roll of a revoked or expired key, or of another account's, is refused", async () => {
    const k = await keyWith({});
    const now = new Date();
    const rolled = await database.db.transaction((tx) => rollKey(tx, k.accountId, k.keyId, { graceSeconds: 0, now, createdBy: "operator" }));
    expect((await k.call({ now })).outcome).toBe("key_expired");
    expect(await database.db.transaction((tx) => rollKey(tx, k.accountId, k.keyId, { graceSeconds: 0, now, createdBy: "operator" }))).toBeUndefined();
    const other = await keyWith({});
    expect(await database.db.transaction((tx) => rollKey(tx, other.accountId, rolled!.newKeyId, { graceSeconds: 0, now, createdBy: "operator" }))).toBeUndefined();
  });
});
