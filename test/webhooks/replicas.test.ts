import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { grant } from "../../src/admin/account-funding.js";
import { DECISION_RESERVE_UNITS_PER_QUESTION } from "../../src/metering/meter.js";
import { sendTestEvent } from "../../src/webhooks/deliveries.js";
import { NO_KEY_LIMITS, setKeyLimits } from "../../src/keys/key-limits.js";
import { createApiKey } from "../../src/keys/store.js";
import { addEndpoint } from "../../src/webhooks/endpoints.js";
import { setAlertSettings } from "../../src/webhooks/events.js";
import { recordExpiringKeys } from "../../src/webhooks/key-expiry.js";
import { createTestAccount, postJson } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { isProbe, logprobsReply, PROBE_OK, startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { assertInvariants } from "../support/invariants.js";
import { startServiceProcess, type ServiceProcess } from "../support/process.js";
import { waitFor } from "../support/wait.js";
import { startWebhookReceiver, type WebhookReceiver } from "../support/webhook-receiver.js";

/**
 * Two service processes on one database deliver the events of real calls
 * made through both: the receiver verifies every signature and sees exactly
 * low, depleted, recovered, in order, once each; both check for expiring
 * keys, and each key is warned once. Then kill -9 of the service
 * while a delivery is in flight: the replicas started after it send the same
 * event again, with the same webhook-id, and nothing is recorded twice.
 * Leases are short here (1 s attempt timeout + 1 s margin).
 */
const CHARGE = 10_000;
let database: TestDatabase;
let fake: FakeLlm;
let receiver: WebhookReceiver;
let replicas: ServiceProcess[] = [];

const replicaEnv = () => ({
  DATABASE_URL: database.url,
  TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
  TYPESAFE_LLM_MAX_RETRIES: "0",
  TYPESAFE_LEASE_MARGIN_MS: "1000",
  TYPESAFE_SWEEP_INTERVAL_MS: "200",
  TYPESAFE_LOG_LEVEL: "info",
  TYPESAFE_DB_POOL_MAX: database.isExternal ? "10" : "3",
  TYPESAFE_WEBHOOK_ALLOW_LOOPBACK: "on",
  TYPESAFE_WEBHOOK_POLL_MS: "50",
  TYPESAFE_WEBHOOK_TIMEOUT_MS: "1000",
  TYPESAFE_WEBHOOK_RETRY_DELAYS_MS: "100,100,100,100,100",
  TYPESAFE_WEBHOOK_KEY_EXPIRY_CHECK_MS: "20",
});
const startReplicas = () => Promise.all([startServiceProcess(replicaEnv()), startServiceProcess(replicaEnv())]);
const running = (r: ServiceProcess) => r.child.exitCode === null && r.child.signalCode === null;

beforeAll(async () => {
  database = await createTestDatabase(10, { countsDeliveries: true });
  // Every decision charges exactly CHARGE units: its one question's prompt tokens.
  fake = await startFakeLlm((request) => (isProbe(request.body) ? PROBE_OK : logprobsReply({ yes: 0.9, no: 0.1 }, { prompt: CHARGE })));
  receiver = await startWebhookReceiver();
  replicas = await startReplicas();
}, 60_000);
afterAll(async () => {
  await Promise.all(replicas.map((r) => (running(r) ? r.stop() : undefined)));
  await receiver?.close();
  await fake?.close();
  await database?.close();
});

const decision = { model: "typesafe/service-1.13", state: "a state", questions: { q: { type: "noul", instructions: "Yes?" } } };

async function accountWithEndpoint(units: number) {
  const account = await createTestAccount(database.db, { units });
  const added = await addEndpoint(database.db, account.accountId, receiver.url, { actor: "operator", at: new Date() });
  receiver.secrets.push(added!.secret);
  return { ...account, endpointId: added!.endpoint.id };
}
const receivedFor = (accountId: string) => receiver.received.filter((r) => r.data["account_id"] === accountId);

describe("webhooks with two replicas", () => {
  it("calls through both replicas and a grant: low, depleted, recovered arrive once each, in order, signed", async () => {
    const { accountId, apiKey } = await accountWithEndpoint(60_000);
    await setAlertSettings(database.db, accountId, [45_000], DECISION_RESERVE_UNITS_PER_QUESTION);
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) statuses.push((await postJson(`${replicas[i % 2]!.url}/api/v1/decisions`, decision, { apiKey })).status);
    // 60,000 → 50,000 → 40,000 (low) → 30,000 (depleted) → refused: 30,000 no longer covers a reservation.
    expect(statuses).toEqual([200, 200, 200, 402]);
    await grant(database.db, accountId, 100_000, 0);

    await waitFor(() => receivedFor(accountId).length >= 3, "three deliveries", 30_000);
    const got = receivedFor(accountId);
    expect(got.map((r) => r.type)).toEqual(["balance.low", "balance.depleted", "balance.recovered"]);
    expect(got.map((r) => r.data)).toEqual([
      { account_id: accountId, threshold_credits: 0.045, balance_credits: 0.04, available_credits: 0.04 },
      { account_id: accountId, smallest_reservation_credits: 0.032, balance_credits: 0.03, available_credits: 0.03 },
      { account_id: accountId, thresholds_credits: [0.045], depleted_ended: true, balance_credits: 0.13, available_credits: 0.13 },
    ]);
    expect(got.every((r) => r.verifiedWith.length === 1)).toBe(true);
    expect(new Set(got.map((r) => r.webhookId)).size).toBe(3);
    const events = await database.db("account_events").where({ account_id: accountId }).orderBy("id");
    expect(events.map((e) => e.type)).toEqual(["balance.low", "balance.depleted", "balance.recovered"]);
    await assertInvariants(database.db, accountId);
  }, 60_000);

  it("both replicas check for expiring keys every 20 ms: each key is warned once, one event and one delivery", async () => {
    const { accountId } = await accountWithEndpoint(0);
    const keyIds: string[] = [];
    for (let i = 0; i < 10; i++) {
      const { keyId } = await createApiKey(database.db, accountId, { name: `k${i}` });
      const expiresAt = new Date(Date.now() + 3 * 86_400_000 + i * 1000);
      await database.db.transaction((tx) => setKeyLimits(tx, accountId, keyId, { ...NO_KEY_LIMITS, expiresAt }));
      keyIds.push(keyId);
    }
    await waitFor(() => receivedFor(accountId).length >= 10, "ten key.expiring deliveries", 30_000);
    // Any check still running finds nothing left: every key is marked in the transaction of its event.
    expect(await recordExpiringKeys(database.db, new Date())).toBe(0);
    const events = await database.db("account_events").where({ account_id: accountId }).orderBy("id");
    expect(events.map((e) => e.type)).toEqual(Array(10).fill("key.expiring"));
    expect(events.map((e) => e.data.key_id).sort()).toEqual([...keyIds].sort());
    const got = receivedFor(accountId);
    expect(got.every((r) => r.type === "key.expiring" && r.verifiedWith.length === 1)).toBe(true);
    expect(new Set(got.map((r) => r.webhookId)).size).toBe(got.length);
  }, 60_000);

  it("kill -9 of the service during a delivery: the next replicas send it again with the same webhook-id; nothing recorded twice", async () => {
    const { accountId, endpointId } = await accountWithEndpoint(0);
    let first = true;
    const arrived = new Promise<void>((resolve) => {
      receiver.answer = (r) => {
        if (r.data["account_id"] !== accountId) return 200;
        if (first) {
          first = false;
          resolve();
          return "hang";
        }
        return 200;
      };
    });
    const webhookId = await sendTestEvent(database.db, accountId, endpointId);
    await arrived;
    // Whichever replica holds the delivery, it dies now, mid-request.
    await Promise.all(replicas.map((r) => r.stop("SIGKILL")));
    replicas = await startReplicas();
    await waitFor(async () => (await database.db("webhook_deliveries").where({ endpoint_id: endpointId }).first()).state === "delivered", "redelivered", 30_000);
    expect(receivedFor(accountId).map((r) => r.webhookId)).toEqual([webhookId, webhookId]);
    expect(receivedFor(accountId).every((r) => r.verifiedWith.length === 1)).toBe(true);
    expect(await database.db("account_events").where({ account_id: accountId })).toHaveLength(1);
    const attempts = await database.db("webhook_attempts").whereIn("delivery_id", database.db("webhook_deliveries").where({ endpoint_id: endpointId }).select("id"));
    // The killed attempt left no record; the one that succeeded did.
    expect(attempts.map((a) => a.status)).toEqual([200]);
    receiver.answer = () => 200;
  }, 60_000);

  it("SIGTERM stops each replica promptly, its delivery loop included", async () => {
    const codes = await Promise.all(replicas.map((r) => r.stop("SIGTERM")));
    expect(codes).toEqual([0, 0]);
  });
});
