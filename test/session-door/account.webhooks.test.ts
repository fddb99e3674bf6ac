import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { grant } from "../../src/admin/account-funding.js";
import { createTestAccount, postJson } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { meteredCall } from "../support/metering.js";
import { waitFor } from "../support/wait.js";
import { startWebhookReceiver, type WebhookReceiver } from "../support/webhook-receiver.js";
import { accountClient, inviteMember, refusal, startAccountApp, uniqueEmail, type AccountTestApp } from "./support.js";

/**
 * Alerts and webhook endpoints through the AccountService, as a member:
 * thresholds, endpoints with their secret shown once, the low-balance flag
 * behind the page's banner, deliveries with their attempts, replay, test
 * events, rotation and removal; bad input is a typed 400 naming its field,
 * another account's endpoint a 404.
 */
let database: TestDatabase;
let service: AccountTestApp;
let receiver: WebhookReceiver;

beforeAll(async () => {
  database = await createTestDatabase(10, { countsDeliveries: true });
  service = await startAccountApp(database, { TYPESAFE_WEBHOOK_ALLOW_LOOPBACK: "on", TYPESAFE_WEBHOOK_POLL_MS: "50" });
  receiver = await startWebhookReceiver();
});
afterAll(async () => {
  await service?.stop();
  await receiver?.close();
  await database?.close();
});

async function signedInMember(units: number) {
  const account = await createTestAccount(database.db, { units });
  const { token } = await inviteMember(database.db, account.accountId, uniqueEmail("alerts"), service.clock.now(), "admin");
  const { client, jar } = accountClient(service.url);
  await client.acceptInvite({ inviteToken: token, password: "correct horse battery" });
  return { ...account, client, jar };
}

describe("alerts and webhooks in the account area", () => {
  it("sets a threshold and an endpoint, spends below it, and sees the flag and the signed delivery", async () => {
    const { client, apiKey, accountId } = await signedInMember(1_000_000);
    expect((await client.getAlerts({})).alerts).toMatchObject({ thresholdsCredits: [], crossedCredits: [], depleted: false });
    const set = await client.setAlerts({ thresholdsCredits: [0.5, 0.25] });
    expect(set.alerts).toMatchObject({ thresholdsCredits: [0.5, 0.25], crossedCredits: [] });
    const added = await client.addWebhookEndpoint({ url: receiver.url });
    expect(added.secret).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);
    receiver.secrets.push(added.secret);
    const listed = await client.listWebhookEndpoints({});
    expect(listed.endpoints).toHaveLength(1);
    expect(JSON.stringify(listed, (_key, value: unknown) => (typeof value === "bigint" ? String(value) : value))).not.toContain(added.secret);
    expect((await client.getAccount({})).account?.balanceLow).toBe(false);

    await service.app.meter.run(meteredCall(apiKey, { reserveUnits: 600_000, freeAllowed: false }), async () => ({ value: null, chargeUnits: 600_000 }));
    expect((await client.getAccount({})).account?.balanceLow).toBe(true);
    expect((await client.getAlerts({})).alerts?.crossedCredits).toEqual([0.5]);
    await waitFor(async () => (await client.listWebhookDeliveries({})).deliveries[0]?.state === "delivered", "the delivery");
    const [delivery] = (await client.listWebhookDeliveries({})).deliveries;
    expect(delivery).toMatchObject({ eventType: "balance.low", state: "delivered" });
    expect(delivery!.attempts.map((a) => [a.attempt, a.status, a.error])).toEqual([[1, 200, ""]]);
    const got = receiver.received.filter((r) => r.webhookId === delivery!.webhookId);
    expect(got).toHaveLength(1);
    expect(got[0]!.verifiedWith).toEqual([added.secret]);
    expect(got[0]!.data).toMatchObject({ account_id: accountId, threshold_credits: 0.5 });

    await client.replayWebhookDelivery({ deliveryId: delivery!.id });
    await waitFor(() => receiver.received.filter((r) => r.webhookId === delivery!.webhookId).length === 2, "the replay");
    const test = await client.sendTestWebhook({ endpointId: added.endpoint!.id });
    await waitFor(() => receiver.received.some((r) => r.webhookId === test.webhookId && r.type === "webhook.test"), "the test event");

    await grant(database.db, accountId, 1_000_000, 0);
    expect((await client.getAccount({})).account?.balanceLow).toBe(false);

    const rotated = await client.rotateWebhookSecret({ endpointId: added.endpoint!.id });
    expect(rotated.secret).not.toBe(added.secret);
    expect(rotated.endpoint?.previousSecretUntil).toBeDefined();
    await client.removeWebhookEndpoint({ endpointId: added.endpoint!.id });
    expect((await client.listWebhookEndpoints({})).endpoints).toEqual([]);
    const kinds = (await client.listActivity({})).events.map((e) => e.kind);
    expect(kinds).toEqual(expect.arrayContaining(["alerts_set", "webhook_endpoint_added", "webhook_secret_rotated", "webhook_endpoint_removed"]));
  });

  it.each([
    [{ thresholdsCredits: [0] }, "thresholds_credits[0]"],
    [{ thresholdsCredits: [1, -2] }, "thresholds_credits[1]"],
    [{ thresholdsCredits: [0.0000001] }, "thresholds_credits[0]"],
    [{ thresholdsCredits: [1, 2, 3, 4, 5, 6] }, "thresholds_credits"],
  ])("setAlerts %j: a 400 naming %s", async (request, field) => {
    const { client } = await signedInMember(0);
    expect(await refusal(client.setAlerts(request))).toMatchObject({ reason: "INVALID_ARGUMENT", field });
  });

  it.each([
    ["not a url", "must be an absolute http:// or https:// URL"],
    ["http://10.0.0.1/hooks", "must reach a public address (10.0.0.1 is a private address)"],
    ["http://169.254.169.254/latest/meta-data", "must reach a public address (169.254.169.254 is a metadata address)"],
    ["gopher://example.com/", "must be an http:// or https:// URL"],
  ])("addWebhookEndpoint %s: a 400 naming url", async (url, rule) => {
    const { client } = await signedInMember(0);
    expect(await refusal(client.addWebhookEndpoint({ url }))).toMatchObject({ reason: "INVALID_ARGUMENT", field: "url", rule });
  });

  it("the JSON gateway gives the same typed 400, naming the field", async () => {
    const { jar } = await signedInMember(0);
    const cookie = [...jar.cookies].map(([n, v]) => `${n}=${v}`).join("; ");
    const response = await postJson(`${service.url}/account/v1/webhooks`, { url: "http://192.168.1.1/" }, { headers: { cookie, origin: service.url } });
    expect(response.status).toBe(400);
    expect(response.body.message).toBe("url: must reach a public address (192.168.1.1 is a private address)");
  });

  it("another account's endpoint and delivery are answered as unknown ones", async () => {
    const owner = await signedInMember(0);
    const added = await owner.client.addWebhookEndpoint({ url: receiver.url });
    const test = await owner.client.sendTestWebhook({ endpointId: added.endpoint!.id });
    await waitFor(() => receiver.received.some((r) => r.webhookId === test.webhookId), "the owner's test event");
    await waitFor(async () => (await owner.client.listWebhookDeliveries({})).deliveries[0]?.state === "delivered", "recorded");
    const [delivery] = (await owner.client.listWebhookDeliveries({})).deliveries;
    const stranger = await signedInMember(0);
    const id = added.endpoint!.id;
    for (const call of [
      () => stranger.client.sendTestWebhook({ endpointId: id }),
      () => stranger.client.rotateWebhookSecret({ endpointId: id }),
      () => stranger.client.removeWebhookEndpoint({ endpointId: id }),
      () => stranger.client.enableWebhookEndpoint({ endpointId: id }),
      () => stranger.client.sendTestWebhook({ endpointId: "not-an-id" }),
    ]) {
      expect(await refusal(call())).toMatchObject({ reason: "NOT_FOUND", field: "endpoint_id" });
    }
    expect(await refusal(stranger.client.replayWebhookDelivery({ deliveryId: delivery!.id }))).toMatchObject({ reason: "NOT_FOUND", field: "delivery_id" });
    expect((await stranger.client.listWebhookDeliveries({})).deliveries).toEqual([]);
    expect((await stranger.client.listWebhookEndpoints({})).endpoints).toEqual([]);
  });
});
