import type { Knex } from "knex";

/** A delivery of one event to one endpoint, with its attempts, as the account sees it. */
export interface DeliveryView {
  id: string;
  endpointId: string;
  webhookId: string;
  eventType: string;
  eventAt: Date;
  state: "pending" | "delivered" | "failed";
  attempts: AttemptView[];
  nextAttemptAt: Date | undefined;
}

export interface AttemptView {
  attempt: number;
  at: Date;
  /** Absent when no answer came. */
  status: number | undefined;
  latencyMs: number;
  error: string;
}

/** The account's latest deliveries, newest first, each with every attempt. */
export async function listDeliveries(db: Knex | Knex.Transaction, accountId: string, limit: number): Promise<DeliveryView[]> {
  const rows = await db("webhook_deliveries as d")
    .join("account_events as ev", "ev.id", "d.event_id")
    .where("ev.account_id", accountId)
    .orderBy("d.id", "desc")
    .limit(limit)
    .select("d.id", "d.endpoint_id", "d.state", "d.next_attempt_at", "ev.webhook_id", "ev.type", "ev.at");
  const ids = rows.map((r) => r.id);
  const attempts = ids.length === 0 ? [] : await db("webhook_attempts").whereIn("delivery_id", ids).orderBy("id");
  return rows.map((r) => ({
    id: String(r.id),
    endpointId: r.endpoint_id,
    webhookId: r.webhook_id,
    eventType: r.type,
    eventAt: r.at,
    state: r.state,
    nextAttemptAt: r.state === "pending" ? r.next_attempt_at : undefined,
    attempts: attempts
      .filter((a) => String(a.delivery_id) === String(r.id))
      .map((a) => ({ attempt: a.attempt, at: a.at, status: a.status ?? undefined, latencyMs: a.latency_ms, error: a.error })),
  }));
}

/**
 * Sends a delivery again, with the same webhook-id, as soon as a replica is
 * free: a delivered one once more, a failed one with a fresh retry schedule.
 * False when it is not the account's or is pending already.
 */
export async function replayDelivery(db: Knex | Knex.Transaction, accountId: string, deliveryId: string, now: Date): Promise<boolean> {
  if (!/^\d{1,18}$/.test(deliveryId)) return false;
  const updated = await db("webhook_deliveries as d")
    .whereRaw("d.id = ? AND d.state <> 'pending'", [deliveryId])
    .whereExists(db("account_events as ev").whereRaw("ev.id = d.event_id AND ev.account_id = ?", [accountId]))
    .update({ state: "pending", next_attempt_at: now, finished_at: null, replayed_after: db.raw("attempts") });
  return updated > 0;
}

/** Records a `webhook.test` event with one delivery, to this endpoint only. */
export async function sendTestEvent(db: Knex, accountId: string, endpointId: string): Promise<string> {
  return db.transaction(async (tx) => {
    const [event] = await tx("account_events").insert({ account_id: accountId, type: "webhook.test", data: { message: "a test event, sent on request" } }).returning(["id", "webhook_id"]);
    await tx("webhook_deliveries").insert({ event_id: event.id, endpoint_id: endpointId });
    return event.webhook_id as string;
  });
}
