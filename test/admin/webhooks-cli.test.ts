import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { runAdmin } from "../support/process.js";
import { waitFor } from "../support/wait.js";
import { startWebhookReceiver, type WebhookReceiver } from "../support/webhook-receiver.js";

/**
 * The operator's alert and webhook commands, run as the operator runs them
 * (a process of their own) against the service's database, while the
 * service delivers: thresholds, an endpoint whose secret is printed once, a
 * test event the receiver verifies, the delivery log, rotation and removal.
 */
let database: TestDatabase;
let service: TestApp;
let receiver: WebhookReceiver;

beforeAll(async () => {
  database = await createTestDatabase(10, { countsDeliveries: true });
  service = await startTestApp(database, { TYPESAFE_WEBHOOK_ALLOW_LOOPBACK: "on", TYPESAFE_WEBHOOK_POLL_MS: "50" });
  receiver = await startWebhookReceiver();
});
afterAll(async () => {
  await service?.stop();
  await receiver?.close();
  await database?.close();
});

const admin = async (args: string[], env: Record<string, string> = {}) => {
  const result = await runAdmin(args, { DATABASE_URL: database.url, ...env });
  return { ...result, json: result.code === 0 ? JSON.parse(result.stdout) : undefined };
};

describe("operator CLI: alerts and webhooks", () => {
  it("sets thresholds, adds an endpoint, sends a test event and reads the delivery log", async () => {
    const { accountId } = await createTestAccount(database.db, { units: 3_000_000 });
    const set = await admin(["alerts", "set", "--account", accountId, "--thresholds", "5,1.5"]);
    // 3 credits is already below 5: its low is recorded by the same statement.
    expect(set.json).toEqual({ account_id: accountId, thresholds_credits: [5, 1.5], crossed_credits: [5], depleted: false });
    expect((await admin(["alerts", "show", "--account", accountId])).json).toEqual(set.json);

    const added = await admin(["webhooks", "add", "--account", accountId, "--url", receiver.url], { TYPESAFE_WEBHOOK_ALLOW_LOOPBACK: "on" });
    expect(added.json).toMatchObject({ account_id: accountId, url: receiver.url, secret: expect.stringMatching(/^whsec_/) });
    receiver.secrets.push(added.json.secret);
    const listed = await admin(["webhooks", "list", "--account", accountId]);
    expect(listed.json.endpoints).toEqual([expect.objectContaining({ endpoint_id: added.json.endpoint_id, enabled: true })]);
    expect(listed.stdout).not.toContain(added.json.secret);

    const test = await admin(["webhooks", "test", "--account", accountId, "--endpoint", added.json.endpoint_id]);
    await waitFor(() => receiver.received.some((r) => r.webhookId === test.json.webhook_id), "the test event");
    expect(receiver.received.find((r) => r.webhookId === test.json.webhook_id)!.verifiedWith).toEqual([added.json.secret]);
    await waitFor(async () => (await database.db("webhook_deliveries").where({ state: "delivered" }).whereIn("event_id", database.db("account_events").where({ account_id: accountId }).select("id"))).length === 1, "recorded as delivered");
    const log = (await admin(["webhooks", "deliveries", "--account", accountId])).json.deliveries;
    expect(log[0]).toMatchObject({ webhookId: test.json.webhook_id, eventType: "webhook.test", attempts: [expect.objectContaining({ attempt: 1, status: 200 })] });

    const rotated = await admin(["webhooks", "rotate", "--account", accountId, "--endpoint", added.json.endpoint_id]);
    expect(rotated.json.secret).toMatch(/^whsec_/);
    expect(rotated.json.secret).not.toBe(added.json.secret);
    expect((await admin(["webhooks", "remove", "--account", accountId, "--endpoint", added.json.endpoint_id])).json).toMatchObject({ removed: true });
    expect((await admin(["webhooks", "list", "--account", accountId])).json.endpoints).toEqual([]);
  }, 120_000);

  it.each([
    [["webhooks", "add", "--url", "http://127.0.0.1:9/hooks"], "--url must reach a public address (127.0.0.1 is a loopback address)"],
    [["webhooks", "add", "--url", "http://169.254.169.254/"], "--url must reach a public address (169.254.169.254 is a metadata address)"],
    [["alerts", "set", "--thresholds", "0"], "--thresholds[0]: each above 0"],
    [["alerts", "set", "--thresholds", "abc"], '--thresholds: "abc" is not a credit amount'],
    [["webhooks", "test", "--endpoint", "00000000-0000-0000-0000-000000000000"], "no endpoint with id 00000000-0000-0000-0000-000000000000 in this account"],
  ])("%j is refused with exit code 2 and a message naming the option", async (args, message) => {
    const { accountId } = await createTestAccount(database.db);
    const result = await admin([...args.slice(0, 2), "--account", accountId, ...args.slice(2)]);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain(message);
    expect(result.stdout).toBe("");
  }, 60_000);
});
