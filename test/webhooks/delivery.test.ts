import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { grant } from "../../src/admin/account-funding.js";
import { DECISION_RESERVE_UNITS_PER_QUESTION } from "../../src/metering/meter.js";
import { listDeliveries, replayDelivery, sendTestEvent } from "../../src/webhooks/deliveries.js";
import { addEndpoint, rotateSecret } from "../../src/webhooks/endpoints.js";
import { setAlertSettings } from "../../src/webhooks/events.js";
import { createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { meteredCall } from "../support/metering.js";
import { waitFor } from "../support/wait.js";
import { loopbackOnly, startWebhookReceiver, type WebhookReceiver } from "../support/webhook-receiver.js";

/**
 * Delivery through the real service to a real receiver on loopback that
 * verifies every signature with the specification's algorithm: the order of
 * events, retries with the same webhook-id, a receiver that fails, hangs or is
 * gone, rotation, replay and test events. Retry delays are short here.
 */
let database: TestDatabase;
let service: TestApp;
let receiver: WebhookReceiver;
const guard = loopbackOnly();
const FLOOR = DECISION_RESERVE_UNITS_PER_QUESTION;
const operator = () => ({ actor: "operator", at: new Date() });

beforeAll(async () => {
  database = await createTestDatabase(10, { countsDeliveries: true });
  service = await startTestApp(
    database,
    {
      TYPESAFE_WEBHOOK_ALLOW_LOOPBACK: "on",
      TYPESAFE_WEBHOOK_POLL_MS: "20",
      TYPESAFE_WEBHOOK_TIMEOUT_MS: "1500",
      TYPESAFE_WEBHOOK_RETRY_DELAYS_MS: "50,50,50",
    },
    { overrides: { webhookBeforeConnect: guard.hook } },
  );
  receiver = await startWebhookReceiver();
});
afterAll(async () => {
  await service?.stop();
  await receiver?.close();
  await database?.close();
});

const spend = (apiKey: string, units: number) =>
  service.app.meter.run(meteredCall(apiKey, { reserveUnits: units, freeAllowed: false }), async () => ({ value: null, chargeUnits: units }));

/** An account with one endpoint at the receiver (whose secrets the receiver learns), at `path`. */
async function accountWithEndpoint(units: number, path: string) {
  const account = await createTestAccount(database.db, { units });
  const added = await addEndpoint(database.db, account.accountId, `${receiver.url}/${path}`, operator());
  receiver.secrets.push(added!.secret);
  return { ...account, endpointId: added!.endpoint.id, secret: added!.secret };
}

describe("webhook delivery", () => {
  it("low, depleted and recovered arrive in order, each signed and once", async () => {
    const paths: string[] = [];
    receiver.onReceived = (r) => paths.push(r.webhookId);
    const { accountId, apiKey } = await accountWithEndpoint(200_000, "order");
    await setAlertSettings(database.db, accountId, [100_000], FLOOR);
    await spend(apiKey, 50_000);
    await spend(apiKey, 60_000); // 90,000: low
    await spend(apiKey, 70_000); // 20,000: depleted
    await grant(database.db, accountId, 200_000, 0); // 220,000: recovered
    // At least once: a slow answer may be sent again, always with its webhook-id; the first of each counts.
    const mine = () => receiver.received.filter((r, i, all) => r.data["account_id"] === accountId && all.findIndex((o) => o.webhookId === r.webhookId) === i);
    await waitFor(() => mine().length >= 3, "three deliveries");
    const got = mine();
    expect(got.map((r) => r.type)).toEqual(["balance.low", "balance.depleted", "balance.recovered"]);
    expect(got.every((r) => r.verifiedWith.length === 1)).toBe(true);
    expect(new Set(got.map((r) => r.webhookId)).size).toBe(3);
    expect(got[0]!.data).toEqual({ account_id: accountId, threshold_credits: 0.1, balance_credits: 0.09, available_credits: 0.09 });
    expect(got[2]!.data).toEqual({ account_id: accountId, thresholds_credits: [0.1], depleted_ended: true, balance_credits: 0.22, available_credits: 0.22 });
    await waitFor(async () => (await listDeliveries(database.db, accountId, 10)).every((d) => d.state === "delivered"), "recorded as delivered");
    const log = await listDeliveries(database.db, accountId, 10);
    expect(log.map((d) => d.attempts.at(-1)?.status)).toEqual([200, 200, 200]);
    receiver.onReceived = undefined;
  });

  it("500 then 200: the retry carries the same webhook-id and both attempts are logged", async () => {
    const { accountId, endpointId } = await accountWithEndpoint(0, "flaky");
    let calls = 0;
    receiver.answer = (r) => (r.data["account_id"] === accountId && calls++ === 0 ? 500 : 200);
    const webhookId = await sendTestEvent(database.db, accountId, endpointId);
    service.app.deliverer.wake();
    await waitFor(async () => (await listDeliveries(database.db, accountId, 1))[0]?.state === "delivered", "delivered after a retry");
    const got = receiver.received.filter((r) => r.data["account_id"] === accountId);
    expect(got.map((r) => r.webhookId)).toEqual([webhookId, webhookId]);
    expect(got.every((r) => r.verifiedWith.length === 1)).toBe(true);
    const [delivery] = await listDeliveries(database.db, accountId, 1);
    expect(delivery!.attempts.map((a) => [a.attempt, a.status])).toEqual([
      [1, 500],
      [2, 200],
    ]);
    receiver.answer = () => 200;
  });

  it("a receiver that never answers: each attempt times out, is logged without a status, and the retries keep the webhook-id", async () => {
    const { accountId, endpointId } = await accountWithEndpoint(0, "hang");
    let calls = 0;
    receiver.answer = (r) => (r.data["account_id"] === accountId && calls++ < 2 ? "hang" : 200);
    const webhookId = await sendTestEvent(database.db, accountId, endpointId);
    await waitFor(async () => (await listDeliveries(database.db, accountId, 1))[0]?.state === "delivered", "delivered after two timeouts");
    const got = receiver.received.filter((r) => r.data["account_id"] === accountId);
    expect(got.map((r) => r.webhookId)).toEqual([webhookId, webhookId, webhookId]);
    const [delivery] = await listDeliveries(database.db, accountId, 1);
    expect(delivery!.attempts.map((a) => a.status)).toEqual([undefined, undefined, 200]);
    expect(delivery!.attempts[0]!.error).toMatch(/no answer within 1500 ms/);
    receiver.answer = () => 200;
  });

  it("410 disables the endpoint at once, with an entry in the activity log; nothing more is sent", async () => {
    const { accountId, endpointId } = await accountWithEndpoint(0, "gone");
    receiver.answer = (r) => (r.data["account_id"] === accountId ? 410 : 200);
    await sendTestEvent(database.db, accountId, endpointId);
    await waitFor(async () => (await listDeliveries(database.db, accountId, 1))[0]?.state === "failed", "failed on 410");
    const endpoint = await database.db("webhook_endpoints").where({ id: endpointId }).first();
    expect(endpoint).toMatchObject({ enabled: false, disabled_reason: "the endpoint answered 410 Gone" });
    const activity = await database.db("account_activity").where({ account_id: accountId, kind: "webhook_endpoint_disabled" });
    expect(activity).toHaveLength(1);
    await sendTestEvent(database.db, accountId, endpointId);
    const before = receiver.received.length;
    await waitFor(async () => (await database.db("webhook_deliveries").where({ endpoint_id: endpointId, state: "pending" })).length === 1, "the second stays pending");
    expect(receiver.received.length).toBe(before);
    expect(receiver.received.filter((r) => r.data["account_id"] === accountId)).toHaveLength(1);
    receiver.answer = () => 200;
  });

  it("an endpoint failing through the whole schedule is disabled, with an activity entry", async () => {
    const { accountId, endpointId } = await accountWithEndpoint(0, "failing");
    receiver.answer = (r) => (r.data["account_id"] === accountId ? 503 : 200);
    await sendTestEvent(database.db, accountId, endpointId);
    await waitFor(async () => (await listDeliveries(database.db, accountId, 1))[0]?.state === "failed", "failed after the schedule");
    const [delivery] = await listDeliveries(database.db, accountId, 1);
    expect(delivery!.attempts.map((a) => a.status)).toEqual([503, 503, 503, 503]);
    expect((await database.db("webhook_endpoints").where({ id: endpointId }).first()).enabled).toBe(false);
    const [entry] = await database.db("account_activity").where({ account_id: accountId, kind: "webhook_endpoint_disabled" });
    expect(entry.actor).toBe("system");
    receiver.answer = () => 200;
  });

  it("after a rotation both secrets sign; a replay sends the same webhook-id again", async () => {
    const { accountId, endpointId, secret } = await accountWithEndpoint(0, "rotate");
    const rotated = await rotateSecret(database.db, accountId, endpointId, operator());
    receiver.secrets.push(rotated!.secret);
    const webhookId = await sendTestEvent(database.db, accountId, endpointId);
    await waitFor(() => receiver.received.some((r) => r.webhookId === webhookId), "the test event");
    const first = receiver.received.find((r) => r.webhookId === webhookId)!;
    expect(first.signatures).toHaveLength(2);
    expect(first.verifiedWith.sort()).toEqual([secret, rotated!.secret].sort());
    await waitFor(async () => (await listDeliveries(database.db, accountId, 1))[0]?.state === "delivered", "delivered");
    const [delivery] = await listDeliveries(database.db, accountId, 1);
    expect(await replayDelivery(database.db, accountId, delivery!.id, new Date())).toBe(true);
    await waitFor(() => receiver.received.filter((r) => r.webhookId === webhookId).length === 2, "the replay");
    // Another account cannot replay it.
    const other = await createTestAccount(database.db);
    expect(await replayDelivery(database.db, other.accountId, delivery!.id, new Date())).toBe(false);
  });

  it("the connect hook saw only loopback addresses", () => {
    expect(guard.seen.length).toBeGreaterThan(0);
    expect(guard.seen.every((a) => a === "127.0.0.1")).toBe(true);
  });
});
