import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NO_KEY_LIMITS, rollKey, setKeyLimits, type KeyLimits } from "../../src/keys/key-limits.js";
import { createApiKey, revokeAccountKey } from "../../src/keys/store.js";
import { createAccount } from "../../src/admin/account-funding.js";
import { DECISION_RESERVE_UNITS_PER_QUESTION } from "../../src/metering/meter.js";
import { addEndpoint } from "../../src/webhooks/endpoints.js";
import { listEvents } from "../../src/webhooks/events.js";
import { KEY_EXPIRY_NOTICE_MS, recordExpiringKeys } from "../../src/webhooks/key-expiry.js";
import { startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { assertInvariants } from "../support/invariants.js";
import { meteredCall } from "../support/metering.js";
import { waitFor } from "../support/wait.js";
import { loopbackOnly, startWebhookReceiver, type WebhookReceiver } from "../support/webhook-receiver.js";

/**
 * The per-key events, from real settles through the service's meter and from
 * the service's own periodic expiry check, delivered to a real receiver that
 * verifies every signature. `key.budget_reached` is recorded by the key row's
 * trigger in the settle's transaction; `key.expiring` by each replica's check
 * on the service's clock, which this test moves.
 */
const FLOOR = DECISION_RESERVE_UNITS_PER_QUESTION;
const DAY_MS = 86_400_000;
let database: TestDatabase;
let service: TestApp;
let receiver: WebhookReceiver;
let clockMs = Date.now();
const clock = () => new Date(clockMs);
const guard = loopbackOnly();

beforeAll(async () => {
  database = await createTestDatabase(10, { countsDeliveries: true });
  service = await startTestApp(
    database,
    { TYPESAFE_WEBHOOK_ALLOW_LOOPBACK: "on", TYPESAFE_WEBHOOK_POLL_MS: "20", TYPESAFE_WEBHOOK_KEY_EXPIRY_CHECK_MS: "20" },
    { overrides: { now: clock, webhookBeforeConnect: guard.hook } },
  );
  receiver = await startWebhookReceiver();
});
afterAll(async () => {
  await service?.stop();
  await receiver?.close();
  await database?.close();
});

/** An account with money, an endpoint at the receiver, and one key named "ci" with these limits. */
async function keyWith(limits: Partial<KeyLimits>) {
  const account = await createAccount(database.db, { name: "keys", units: 10_000_000, freeRequests: 0 });
  await database.db("accounts").where({ id: account.id }).update({ max_in_flight: 40, rate_limit: 1000 });
  const added = await addEndpoint(database.db, account.id, receiver.url, { actor: "operator", at: new Date() });
  receiver.secrets.push(added!.secret);
  const key = await createApiKey(database.db, account.id, { name: "ci" });
  await setLimits(account.id, key.keyId, limits);
  return { accountId: account.id, keyId: key.keyId, apiKey: key.apiKey };
}
const setLimits = (accountId: string, keyId: string, limits: Partial<KeyLimits>) =>
  database.db.transaction((tx) => setKeyLimits(tx, accountId, keyId, { ...NO_KEY_LIMITS, ...limits }));
const perDay = (units: number): Partial<KeyLimits> => ({ budget: { units, period: "day" } });

/** A call that reserves `reserveUnits` and is charged `units`. */
const spend = (apiKey: string, units: number, reserveUnits = units) =>
  service.app.meter.run(meteredCall(apiKey, { reserveUnits, freeAllowed: false }), async () => ({ value: null, chargeUnits: units }));
const recorded = async (accountId: string) =>
  (await listEvents(database.db, accountId, 100)).reverse().map((e): Record<string, unknown> => ({ type: e.type, ...e.data }));
/** What the receiver got for the account, first delivery of each event, every one verified. */
const delivered = (accountId: string) =>
  receiver.received.filter((r, i, all) => r.data["account_id"] === accountId && all.findIndex((o) => o.webhookId === r.webhookId) === i);
const startOfUtcDay = (ms: number) => new Date(Math.floor(ms / DAY_MS) * DAY_MS);

describe("key.budget_reached", () => {
  it("once, at the settle that leaves less than a call's smallest reservation; delivered signed with the key's figures", async () => {
    const { accountId, keyId, apiKey } = await keyWith(perDay(100_000));
    const last4 = apiKey.slice(-4);
    await spend(apiKey, 50_000); // left 50,000: a decision still fits
    await spend(apiKey, 18_000); // left 32,000: exactly one decision's reservation, still fits
    expect(await recorded(accountId)).toEqual([]);
    await spend(apiKey, 1); // left 31,999
    await expect(spend(apiKey, 1, FLOOR)).rejects.toThrow(/budget/i);
    await spend(apiKey, 10_000); // a smaller call still fits: left 21,999, nothing more recorded
    const start = startOfUtcDay(Date.now());
    const event = {
      type: "key.budget_reached",
      key_id: keyId,
      key_name: "ci",
      key_prefix: apiKey.slice(0, 14),
      key_last4: last4,
      budget_units: 100_000,
      spent_units: 68_001,
      left_units: 31_999,
      period: "day",
      period_start: start.toISOString().replace(".000", ""),
      period_end: new Date(start.getTime() + DAY_MS).toISOString().replace(".000", ""),
      smallest_reservation_units: FLOOR,
    };
    expect(await recorded(accountId)).toEqual([event]);

    await waitFor(() => delivered(accountId).length >= 1, "the delivery");
    const [got] = delivered(accountId);
    expect(got!.verifiedWith).toHaveLength(1);
    expect(got!.type).toBe("key.budget_reached");
    expect(got!.data).toEqual({
      account_id: accountId,
      key_id: keyId,
      key_name: "ci",
      key_prefix: apiKey.slice(0, 14),
      key_last4: last4,
      budget_credits: 0.1,
      spent_credits: 0.068001,
      left_credits: 0.031999,
      period: "day",
      period_start: event.period_start,
      period_end: event.period_end,
      smallest_reservation_credits: 0.032,
    });
    expect(got!.body).not.toContain(apiKey.slice(8));
    await assertInvariants(database.db, accountId);
  });

  it("a raised budget re-arms it only once it covers a call again; a small raise does not", async () => {
    const { accountId, keyId, apiKey } = await keyWith(perDay(100_000));
    await spend(apiKey, 70_000); // left 30,000: reached
    await setLimits(accountId, keyId, perDay(101_000)); // left 31,000: still short, still told
    await spend(apiKey, 1_000);
    expect((await recorded(accountId)).map((e) => e["type"])).toEqual(["key.budget_reached"]);
    await setLimits(accountId, keyId, perDay(140_000)); // left 69,000: re-armed, nothing to say
    expect(await recorded(accountId)).toHaveLength(1);
    await spend(apiKey, 40_000); // left 29,000: reached again
    const events = await recorded(accountId);
    expect(events.map((e) => [e["type"], e["budget_units"], e["left_units"]])).toEqual([
      ["key.budget_reached", 100_000, 30_000],
      ["key.budget_reached", 140_000, 29_000],
    ]);
    await waitFor(() => delivered(accountId).length >= 2, "both deliveries");
    expect(delivered(accountId).map((r) => r.data["left_credits"])).toEqual([0.03, 0.029]);
  });

  it("a new period re-arms it: reached yesterday, reached again by today's spend", async () => {
    const { accountId, keyId, apiKey } = await keyWith(perDay(100_000));
    await spend(apiKey, 70_000);
    expect(await recorded(accountId)).toHaveLength(1);
    // As if all of that was yesterday's: the row's period and its recorded crossing move back a day together.
    const yesterday = new Date(startOfUtcDay(Date.now()).getTime() - DAY_MS);
    await database.db("api_keys").where({ id: keyId }).update({ budget_period_start: yesterday, budget_reached_in: yesterday });
    expect(await recorded(accountId)).toHaveLength(1);
    await spend(apiKey, 80_000); // today's first spend: left 20,000 of today's budget
    const events = await recorded(accountId);
    expect(events.map((e) => [e["spent_units"], e["period_start"]])).toEqual([
      [70_000, startOfUtcDay(Date.now()).toISOString().replace(".000", "")],
      [80_000, startOfUtcDay(Date.now()).toISOString().replace(".000", "")],
    ]);
  });

  it("a total budget has no period: its event says so, and it is told once for good", async () => {
    const { accountId, apiKey } = await keyWith({ budget: { units: 40_000, period: "total" } });
    await spend(apiKey, 10_000);
    await spend(apiKey, 1_000);
    await spend(apiKey, 1_000);
    const events = await recorded(accountId);
    expect(events).toHaveLength(1);
    expect(events[0]).toMatchObject({ period: "total", period_start: null, period_end: null, left_units: 30_000 });
  });

  it("a budget lowered below what the key spent is told at once, by the change itself", async () => {
    const { accountId, keyId, apiKey } = await keyWith(perDay(1_000_000));
    await spend(apiKey, 50_000);
    await expect(
      database.db.transaction(async (tx) => {
        await setKeyLimits(tx, accountId, keyId, { ...NO_KEY_LIMITS, ...perDay(60_000) });
        throw new Error("rolled back");
      }),
    ).rejects.toThrow("rolled back");
    expect(await recorded(accountId)).toEqual([]);
    await setLimits(accountId, keyId, perDay(60_000));
    expect((await recorded(accountId)).map((e) => [e["type"], e["spent_units"], e["left_units"]])).toEqual([["key.budget_reached", 50_000, 10_000]]);
  });

  it("20 concurrent settles crossing together record exactly one", async () => {
    const { accountId, apiKey } = await keyWith(perDay(620_000));
    const outcomes = await Promise.allSettled(Array.from({ length: 20 }, () => spend(apiKey, 30_000)));
    expect(outcomes.filter((o) => o.status === "fulfilled")).toHaveLength(20);
    const events = await recorded(accountId);
    expect(events.map((e) => [e["type"], e["spent_units"]])).toEqual([["key.budget_reached", 600_000]]);
    await assertInvariants(database.db, accountId);
  });

  it("a rolled key carries on its period's spend without a second event; nothing for keys without budgets", async () => {
    const { accountId, keyId, apiKey } = await keyWith(perDay(100_000));
    await spend(apiKey, 70_000);
    const rolled = await database.db.transaction((tx) => rollKey(tx, accountId, keyId, { graceSeconds: 0, now: new Date(), createdBy: "operator" }));
    await spend(rolled!.apiKey, 5_000);
    // The old key, stopped by the roll, may also hear key.expiring from the service's check.
    const reached = (await recorded(accountId)).filter((e) => e["type"] === "key.budget_reached");
    expect(reached.map((e) => e["key_id"])).toEqual([keyId]);

    const free = await keyWith({});
    await spend(free.apiKey, 9_000_000);
    const revoked = await keyWith(perDay(100_000));
    await spend(revoked.apiKey, 60_000);
    await revokeAccountKey(database.db, revoked.accountId, revoked.keyId, new Date());
    await database.db("api_keys").where({ id: revoked.keyId }).update({ budget_spent: 90_000 });
    expect(await recorded(free.accountId)).toEqual([]);
    expect(await recorded(revoked.accountId)).toEqual([]);
  });
});

describe("key.expiring", () => {
  const expiringEvents = async (accountId: string) => (await recorded(accountId)).filter((e) => e["type"] === "key.expiring");

  it("7 days before the expiry, by the service's own check: once, delivered signed, never with the secret", async () => {
    const expiresAt = new Date(clockMs + 8 * DAY_MS);
    const { accountId, keyId, apiKey } = await keyWith({ expiresAt });
    const other = await keyWith({}); // no expiry: never told
    await recordExpiringKeys(database.db, clock());
    expect(await expiringEvents(accountId)).toEqual([]);

    clockMs += DAY_MS + 1_000; // now 7 days minus a second before the expiry
    await waitFor(async () => (await expiringEvents(accountId)).length > 0, "the check to record it");
    await waitFor(() => delivered(accountId).length >= 1, "the delivery");
    const [got] = delivered(accountId);
    expect(got!.type).toBe("key.expiring");
    expect(got!.verifiedWith).toHaveLength(1);
    expect(got!.data).toEqual({ account_id: accountId, key_id: keyId, key_name: "ci", key_prefix: apiKey.slice(0, 14), key_last4: apiKey.slice(-4), expires_at: expiresAt.toISOString() });
    expect(got!.body).not.toContain(apiKey.slice(8));
    await recordExpiringKeys(database.db, clock());
    expect(await expiringEvents(accountId)).toHaveLength(1);
    expect(await expiringEvents(other.accountId)).toEqual([]);
  });

  it("a changed expiry re-arms it; the same expiry set again does not; a revoked key gets none", async () => {
    const first = new Date(clockMs + 3 * DAY_MS);
    const { accountId, keyId } = await keyWith({ expiresAt: first });
    await waitFor(async () => (await expiringEvents(accountId)).length === 1, "the first warning");
    await setLimits(accountId, keyId, { expiresAt: first });
    await recordExpiringKeys(database.db, clock());
    expect(await expiringEvents(accountId)).toHaveLength(1);

    const second = new Date(clockMs + 5 * DAY_MS);
    await setLimits(accountId, keyId, { expiresAt: second });
    await waitFor(async () => (await expiringEvents(accountId)).length === 2, "the second warning");
    expect((await expiringEvents(accountId)).map((e) => e["expires_at"])).toEqual([first.toISOString(), second.toISOString()]);

    const revoked = await keyWith({ expiresAt: new Date(clockMs + 30 * DAY_MS) });
    await revokeAccountKey(database.db, revoked.accountId, revoked.keyId, clock());
    clockMs += 25 * DAY_MS;
    await recordExpiringKeys(database.db, clock());
    expect(await expiringEvents(revoked.accountId)).toEqual([]);
  });

  it("eight checks at once (replicas) and the service's own warn each key exactly once", async () => {
    const keys = await Promise.all(Array.from({ length: 6 }, (_, i) => keyWith({ expiresAt: new Date(clockMs + KEY_EXPIRY_NOTICE_MS + (i + 1) * 60_000) })));
    clockMs += 10 * 60_000;
    await Promise.all(Array.from({ length: 8 }, () => recordExpiringKeys(database.db, clock())));
    await recordExpiringKeys(database.db, clock());
    for (const key of keys) expect((await expiringEvents(key.accountId)).map((e) => e["key_id"])).toEqual([key.keyId]);
  });

  it("the connect hook saw only loopback addresses", () => {
    expect(guard.seen.length).toBeGreaterThan(0);
    expect(guard.seen.every((a) => a === "127.0.0.1")).toBe(true);
  });
});
