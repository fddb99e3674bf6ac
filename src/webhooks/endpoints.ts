import type { Knex } from "knex";
import { recordActivity } from "../team/activity.js";
import { generateSecret } from "./signing.js";

/** After a rotation the old secret keeps signing this long, so receivers can switch without losing a delivery. */
export const ROTATION_OVERLAP_MS = 24 * 3_600_000;

/** At most this many endpoints per account. */
export const MAX_ENDPOINTS = 10;

/** A row of `webhook_endpoints`. */
export interface DbWebhookEndpointRow {
  id: string;
  account_id: string;
  url: string;
  secret: string;
  previous_secret: string | null;
  previous_secret_until: Date | null;
  enabled: boolean;
  disabled_reason: string;
  created_at: Date;
  deleted_at: Date | null;
}

/** An endpoint as the account sees it: never its secret. */
export interface WebhookEndpointView {
  id: string;
  url: string;
  enabled: boolean;
  disabledReason: string;
  createdAt: Date;
  /** Set while a rotated-out secret still signs. */
  previousSecretUntil: Date | undefined;
}

export function endpointView(row: DbWebhookEndpointRow): WebhookEndpointView {
  return {
    id: row.id,
    url: row.url,
    enabled: row.enabled,
    disabledReason: row.disabled_reason,
    createdAt: row.created_at,
    previousSecretUntil: row.previous_secret_until ?? undefined,
  };
}

/** Who changed an endpoint and when, for the activity log. */
export interface Change {
  actor: string;
  at: Date;
}

/** Adds an endpoint; its secret is returned here only. Undefined when the account already has the most it may. */
export async function addEndpoint(
  db: Knex,
  accountId: string,
  url: string,
  change: Change,
): Promise<{ endpoint: WebhookEndpointView; secret: string } | undefined> {
  return db.transaction(async (tx) => {
    // The account's row orders concurrent additions, so the cap holds.
    await tx("accounts").where({ id: accountId }).forUpdate().first("id");
    const { count } = (await tx("webhook_endpoints").where({ account_id: accountId }).whereNull("deleted_at").count({ count: "*" }).first()) as { count: string };
    if (Number(count) >= MAX_ENDPOINTS) return undefined;
    const secret = generateSecret();
    const [row] = await tx<DbWebhookEndpointRow>("webhook_endpoints").insert({ account_id: accountId, url, secret }).returning("*");
    await recordActivity(tx, { accountId, kind: "webhook_endpoint_added", actor: change.actor, detail: url, at: change.at });
    return { endpoint: endpointView(row!), secret };
  });
}

/** The account's endpoints, oldest first. */
export async function listEndpoints(db: Knex | Knex.Transaction, accountId: string): Promise<WebhookEndpointView[]> {
  const rows = await db<DbWebhookEndpointRow>("webhook_endpoints").where({ account_id: accountId }).whereNull("deleted_at").orderBy("created_at");
  return rows.map(endpointView);
}

/** One live endpoint of the account, or undefined (also for another account's). */
export async function findEndpoint(db: Knex | Knex.Transaction, accountId: string, endpointId: string): Promise<DbWebhookEndpointRow | undefined> {
  return db<DbWebhookEndpointRow>("webhook_endpoints").where({ id: endpointId, account_id: accountId }).whereNull("deleted_at").first();
}

/** Removes an endpoint: nothing more is sent to it; its log stays. */
export async function removeEndpoint(db: Knex, accountId: string, endpointId: string, change: Change): Promise<boolean> {
  return db.transaction(async (tx) => {
    const removed = await tx("webhook_endpoints").where({ id: endpointId, account_id: accountId }).whereNull("deleted_at").update({ deleted_at: change.at, enabled: false }).returning("url");
    if (removed.length === 0) return false;
    await recordActivity(tx, { accountId, kind: "webhook_endpoint_removed", actor: change.actor, detail: removed[0]!.url, at: change.at });
    return true;
  });
}

/** A new secret; the old one keeps signing for ROTATION_OVERLAP_MS. The new secret is returned here only. */
export async function rotateSecret(db: Knex, accountId: string, endpointId: string, change: Change): Promise<{ endpoint: WebhookEndpointView; secret: string } | undefined> {
  return db.transaction(async (tx) => {
    const secret = generateSecret();
    const [row] = await tx<DbWebhookEndpointRow>("webhook_endpoints")
      .where({ id: endpointId, account_id: accountId })
      .whereNull("deleted_at")
      .update({ previous_secret: tx.ref("secret"), previous_secret_until: new Date(change.at.getTime() + ROTATION_OVERLAP_MS), secret } as never)
      .returning("*");
    if (!row) return undefined;
    await recordActivity(tx, { accountId, kind: "webhook_secret_rotated", actor: change.actor, detail: row.url, at: change.at });
    return { endpoint: endpointView(row), secret };
  });
}

/** Enables a disabled endpoint; deliveries still pending resume. */
export async function enableEndpoint(db: Knex, accountId: string, endpointId: string, change: Change): Promise<WebhookEndpointView | undefined> {
  return db.transaction(async (tx) => {
    const [row] = await tx<DbWebhookEndpointRow>("webhook_endpoints")
      .where({ id: endpointId, account_id: accountId })
      .whereNull("deleted_at")
      .update({ enabled: true, disabled_reason: "" })
      .returning("*");
    if (!row) return undefined;
    await recordActivity(tx, { accountId, kind: "webhook_endpoint_enabled", actor: change.actor, detail: row.url, at: change.at });
    return endpointView(row);
  });
}

/** The secrets that sign a delivery now: the current one, and the previous one during its overlap. */
export function liveSecrets(row: Pick<DbWebhookEndpointRow, "secret" | "previous_secret" | "previous_secret_until">, now: Date): string[] {
  const secrets = [row.secret];
  if (row.previous_secret && row.previous_secret_until && row.previous_secret_until.getTime() > now.getTime()) secrets.push(row.previous_secret);
  return secrets;
}
