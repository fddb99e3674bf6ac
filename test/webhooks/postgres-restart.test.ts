import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { grant } from "../../src/admin/account-funding.js";
import { createKnex, migrate } from "../../src/db/database.js";
import { DECISION_RESERVE_UNITS_PER_QUESTION } from "../../src/metering/meter.js";
import { addEndpoint } from "../../src/webhooks/endpoints.js";
import { setAlertSettings } from "../../src/webhooks/events.js";
import { createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { startPrivateCluster, type PrivateCluster } from "../support/private-cluster.js";
import { waitFor } from "../support/wait.js";
import { loopbackOnly, startWebhookReceiver, type WebhookReceiver } from "../support/webhook-receiver.js";

/**
 * A crash of PostgreSQL (immediate stop, then a start with WAL recovery, on a
 * private throwaway cluster) while a delivery is in flight: the service's
 * delivery loop survives it, the delivery is sent again with the same
 * webhook-id, and an event recorded after the restart is delivered too.
 * Nothing is lost and no event is recorded twice.
 */
let cluster: PrivateCluster;
let service: TestApp;
let receiver: WebhookReceiver;
let db: ReturnType<typeof createKnex>;
const guard = loopbackOnly();

beforeAll(async () => {
  cluster = await startPrivateCluster();
  db = createKnex(cluster.url, 4);
  await migrate(db, { useAdvisoryLock: true });
  service = await startTestApp(
    { url: cluster.url, db, isExternal: true, close: () => db.destroy() },
    {
      TYPESAFE_WEBHOOK_ALLOW_LOOPBACK: "on",
      TYPESAFE_WEBHOOK_POLL_MS: "50",
      TYPESAFE_WEBHOOK_TIMEOUT_MS: "1000",
      TYPESAFE_LEASE_MARGIN_MS: "1000",
      TYPESAFE_WEBHOOK_RETRY_DELAYS_MS: "200,200,200,200,200,200",
    },
    { overrides: { webhookBeforeConnect: guard.hook } },
  );
  receiver = await startWebhookReceiver();
}, 120_000);
afterAll(async () => {
  await service?.stop();
  await receiver?.close();
  await db?.destroy();
  cluster?.stop();
});

describe("webhooks across a PostgreSQL crash", () => {
  it("the delivery in flight during the crash is sent again with its webhook-id; later events arrive too", async () => {
    const { accountId } = await createTestAccount(db, { units: 50_000 });
    const added = await addEndpoint(db, accountId, receiver.url, { actor: "operator", at: new Date() });
    receiver.secrets.push(added!.secret);
    let first = true;
    const hanging = new Promise<void>((resolve) => {
      receiver.answer = () => {
        if (!first) return 200;
        first = false;
        resolve();
        return "hang";
      };
    });
    // 50,000 is below 100,000: the low is recorded at once and its delivery starts.
    await setAlertSettings(db, accountId, [100_000], DECISION_RESERVE_UNITS_PER_QUESTION);
    await hanging;
    cluster.crash();
    await waitFor(() => grant(db, accountId, 100_000, 0).then(() => true, () => false), "a grant after the restart", 30_000);
    await waitFor(async () => {
      const pending = await db("webhook_deliveries").whereNot({ state: "delivered" }).count({ n: "*" }).catch(() => [{ n: 1 }]);
      return Number(pending[0]!.n) === 0 && receiver.received.some((r) => r.type === "balance.recovered");
    }, "every delivery done", 30_000);

    const events = await db("account_events").where({ account_id: accountId }).orderBy("id");
    expect(events.map((e) => e.type)).toEqual(["balance.low", "balance.recovered"]);
    const ids = receiver.received.map((r) => r.webhookId);
    expect(ids[0]).toBe(events[0].webhook_id);
    expect(new Set(ids)).toEqual(new Set(events.map((e) => e.webhook_id)));
    expect(ids.filter((id) => id === events[0].webhook_id).length).toBeGreaterThanOrEqual(2);
    expect(receiver.received.every((r) => r.verifiedWith.length === 1)).toBe(true);
    expect(guard.seen.every((a) => a === "127.0.0.1")).toBe(true);
  }, 90_000);
});
