import crypto from "node:crypto";
import type { Knex } from "knex";
import { recordActivity } from "../team/activity.js";
import type { WebhookConfig } from "../config.js";
import type { Logger } from "../logger.js";
import { eventBody, type DbAccountEventRow } from "./events.js";
import { liveSecrets, type DbWebhookEndpointRow } from "./endpoints.js";
import { sendWebhook, type Resolve, type SendOutcome } from "./sender.js";
import { signedHeaders } from "./signing.js";

/** Deliveries one replica sends at once. */
const LOOPS_PER_REPLICA = 4;

/** Who disabled an endpoint, in the activity log. */
const SYSTEM = "system";

export interface DelivererDeps {
  db: Knex;
  config: WebhookConfig;
  logger: Logger;
  resolve: Resolve;
  /** Added to an attempt's timeout to form the lease of a delivery (the metering's lease margin). */
  leaseMarginMs: number;
  now?: () => Date;
  /** See SendOptions.beforeConnect. */
  beforeConnect?: (address: string) => void;
}

export interface Deliverer {
  /** Starts this replica's loop. */
  start(): void;
  /** Looks for due deliveries now instead of at the next poll. */
  wake(): void;
  /** Stops taking deliveries, abandons the one in progress (its lease is given back) and waits for the loop to end. */
  stop(): Promise<void>;
}

/** A delivery taken under lease, with what sending it needs. */
interface Claimed {
  id: string;
  attempts: number;
  replayed_after: number;
  lease_token: string;
  event: DbAccountEventRow;
  endpoint: DbWebhookEndpointRow;
}

/**
 * Delivers the account events to their endpoints, inside the service, shared
 * by every replica through the database: a replica takes one due delivery
 * under a lease (`FOR UPDATE SKIP LOCKED`, then `lease_until`), sends it and
 * records the attempt only while its lease holds. A replica that dies leaves
 * the lease to run out; another then sends the same event again, with the
 * same webhook-id (at least once). The lease outlasts an attempt's timeout,
 * so two replicas never send one delivery at once.
 *
 * An endpoint gets its events in order: a delivery is taken only when no
 * older one to the same endpoint is still pending.
 */
export function createDeliverer(deps: DelivererDeps): Deliverer {
  const { db, config, logger } = deps;
  const now = deps.now ?? (() => new Date());
  const leaseMs = config.timeoutMs + deps.leaseMarginMs;
  const stopping = new AbortController();
  const wakers = new Set<() => void>();
  let loops: Promise<void>[] | undefined;

  const claim = async (): Promise<Claimed | undefined> => {
    const at = now();
    const token = crypto.randomUUID();
    const { rows } = await db.raw<{ rows: Array<{ id: string; attempts: number; replayed_after: number; event_id: string; endpoint_id: string }> }>(
      `WITH next AS (
         SELECT d.id FROM webhook_deliveries d
           JOIN webhook_endpoints e ON e.id = d.endpoint_id
          WHERE d.state = 'pending' AND d.next_attempt_at <= ?
            AND (d.lease_until IS NULL OR d.lease_until < ?)
            AND e.enabled AND e.deleted_at IS NULL
            AND NOT EXISTS (SELECT 1 FROM webhook_deliveries p WHERE p.endpoint_id = d.endpoint_id AND p.state = 'pending' AND p.id < d.id)
          ORDER BY d.next_attempt_at, d.id
          LIMIT 1
          FOR UPDATE OF d SKIP LOCKED)
       UPDATE webhook_deliveries d SET lease_until = ?, lease_token = ?, attempts = d.attempts + 1
         FROM next WHERE d.id = next.id
       RETURNING d.id, d.attempts, d.replayed_after, d.event_id, d.endpoint_id`,
      [at, at, new Date(at.getTime() + leaseMs), token],
    );
    const row = rows[0];
    if (!row) return undefined;
    const [event, endpoint] = await Promise.all([
      db<DbAccountEventRow>("account_events").where({ id: row.event_id }).first(),
      db<DbWebhookEndpointRow>("webhook_endpoints").where({ id: row.endpoint_id }).first(),
    ]);
    return { id: String(row.id), attempts: row.attempts, replayed_after: row.replayed_after, lease_token: token, event: event!, endpoint: endpoint! };
  };

  const record = async (claimed: Claimed, outcome: SendOutcome, at: Date) => {
    const delivered = outcome.status !== undefined && outcome.status >= 200 && outcome.status < 300;
    const gone = outcome.status === 410;
    const retriesUsed = claimed.attempts - claimed.replayed_after;
    const exhausted = !delivered && !gone && retriesUsed > config.retryDelaysMs.length;
    await db.transaction(async (tx) => {
      // Only while the lease is still ours: a replica that outlived it records nothing.
      const held = await tx("webhook_deliveries").where({ id: claimed.id, lease_token: claimed.lease_token }).forUpdate().first("id");
      if (!held) return;
      await tx("webhook_attempts").insert({
        delivery_id: claimed.id,
        attempt: claimed.attempts,
        at,
        status: outcome.status ?? null,
        latency_ms: outcome.latencyMs,
        error: outcome.error.slice(0, 500),
      });
      const finished = delivered || gone || exhausted;
      await tx("webhook_deliveries")
        .where({ id: claimed.id })
        .update({
          state: delivered ? "delivered" : finished ? "failed" : "pending",
          finished_at: finished ? at : null,
          next_attempt_at: finished ? at : new Date(at.getTime() + config.retryDelaysMs[retriesUsed - 1]!),
          lease_until: null,
          lease_token: null,
        });
      if (gone || exhausted) {
        const reason = gone ? "the endpoint answered 410 Gone" : `every attempt failed for ${describeSpan(config.retryDelaysMs)}`;
        const disabled = await tx("webhook_endpoints").where({ id: claimed.endpoint.id, enabled: true }).update({ enabled: false, disabled_reason: reason });
        if (disabled > 0) {
          await recordActivity(tx, { accountId: claimed.event.account_id, kind: "webhook_endpoint_disabled", actor: SYSTEM, detail: `${claimed.endpoint.url}: ${reason}`, at });
        }
      }
    });
  };

  const giveBack = async (claimed: Claimed) => {
    // Not an attempt: the next replica sends it at once, as the same attempt number.
    await db("webhook_deliveries").where({ id: claimed.id, lease_token: claimed.lease_token }).update({ lease_until: null, lease_token: null, attempts: db.raw("attempts - 1") });
  };

  const deliverOne = async (): Promise<boolean> => {
    const claimed = await claim();
    if (!claimed) return false;
    const at = now();
    const body = eventBody(claimed.event);
    const headers = signedHeaders(claimed.event.webhook_id, at, body, liveSecrets(claimed.endpoint, at));
    const outcome = await sendWebhook(claimed.endpoint.url, headers, body, { resolve: deps.resolve, allowLoopback: config.allowLoopback, timeoutMs: config.timeoutMs, beforeConnect: deps.beforeConnect }, stopping.signal);
    if (stopping.signal.aborted && outcome.status === undefined) {
      await giveBack(claimed);
      return false;
    }
    await record(claimed, outcome, at);
    logger.info("webhook attempt", { delivery: claimed.id, attempt: claimed.attempts, status: outcome.status ?? 0, latency_ms: outcome.latencyMs });
    return true;
  };

  const run = async () => {
    while (!stopping.signal.aborted) {
      let busy = false;
      try {
        busy = await deliverOne();
      } catch (err) {
        logger.warn("webhook delivery failed", { error: err instanceof Error ? err.message : String(err) });
      }
      if (busy || stopping.signal.aborted) continue;
      await new Promise<void>((resolve) => {
        const wake = () => {
          clearTimeout(timer);
          wakers.delete(wake);
          stopping.signal.removeEventListener("abort", wake);
          resolve();
        };
        const timer = setTimeout(wake, config.pollIntervalMs);
        wakers.add(wake);
        stopping.signal.addEventListener("abort", wake, { once: true });
      });
    }
  };

  return {
    start() {
      // A few loops, so one endpoint that never answers does not hold every other back.
      loops ??= Array.from({ length: LOOPS_PER_REPLICA }, run);
    },
    wake() {
      for (const wake of [...wakers]) wake();
    },
    async stop() {
      stopping.abort();
      await Promise.all(loops ?? []);
    },
  };
}

/** "3 days, 3 hours" for the sum of the delays. */
function describeSpan(delaysMs: readonly number[]): string {
  const totalMs = delaysMs.reduce((a, b) => a + b, 0);
  const hours = Math.round(totalMs / 3_600_000);
  return hours >= 48 ? `${Math.floor(hours / 24)} days` : hours >= 1 ? `${hours} hours` : `${Math.round(totalMs / 1000)} seconds`;
}
