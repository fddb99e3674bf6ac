import type { Knex } from "knex";
import { unitsToCredits } from "../units.js";

/**
 * What an account can hear about. The balance events are recorded by the
 * database itself, in the transaction of the settle, grant or settings change
 * that causes them, and so is `key.budget_reached` (by the settle or limits
 * change of the key); `key.expiring` by a periodic check of every replica
 * (key-expiry.ts); `webhook.test` only when a member asks for one.
 */
export const EVENT_TYPES = ["balance.low", "balance.depleted", "balance.recovered", "key.budget_reached", "key.expiring", "webhook.test"] as const;
export type EventType = (typeof EVENT_TYPES)[number];

/** A row of `account_events`; `data` holds money in units, as the database wrote it. */
export interface DbAccountEventRow {
  id: string;
  account_id: string;
  webhook_id: string;
  type: EventType;
  data: Record<string, unknown>;
  at: Date;
}

/** At most this many thresholds per account: alerts, not a ladder. */
export const MAX_THRESHOLDS = 5;

/** The account's alert settings, as they are stored (units). */
export interface AlertSettings {
  thresholdsUnits: number[];
  /** Whether `balance.depleted` is watched: set with any alert setting, from the smallest reservation of a call. */
  depletionFloorUnits: number | undefined;
  crossedUnits: number[];
  depleted: boolean;
}

/**
 * Sets the thresholds (units, any order; duplicates merged) and the depletion
 * floor. The trigger on accounts records at once a `balance.low` for each new
 * threshold the available balance is already below, in this same statement.
 */
export async function setAlertSettings(
  db: Knex | Knex.Transaction,
  accountId: string,
  thresholdsUnits: readonly number[],
  depletionFloorUnits: number,
): Promise<AlertSettings | undefined> {
  const sorted = [...new Set(thresholdsUnits)].sort((a, b) => b - a);
  const rows = await db("accounts")
    .where({ id: accountId })
    .update({ alert_thresholds: db.raw("?::bigint[]", [`{${sorted.join(",")}}`]), alert_floor: depletionFloorUnits })
    .returning(["alert_thresholds", "alert_floor", "alert_crossed", "alert_depleted"]);
  return rows[0] ? settingsOf(rows[0]) : undefined;
}

/** The account's alert settings, or undefined for an unknown account. */
export async function readAlertSettings(db: Knex | Knex.Transaction, accountId: string): Promise<AlertSettings | undefined> {
  const row = await db("accounts").where({ id: accountId }).first("alert_thresholds", "alert_floor", "alert_crossed", "alert_depleted");
  return row ? settingsOf(row) : undefined;
}

function settingsOf(row: { alert_thresholds: string[] | null; alert_floor: string | null; alert_crossed: string[]; alert_depleted: boolean }): AlertSettings {
  return {
    thresholdsUnits: (row.alert_thresholds ?? []).map(Number),
    depletionFloorUnits: row.alert_floor === null ? undefined : Number(row.alert_floor),
    crossedUnits: row.alert_crossed.map(Number),
    depleted: row.alert_depleted,
  };
}

/** The account's latest events, newest first. */
export async function listEvents(db: Knex | Knex.Transaction, accountId: string, limit: number): Promise<DbAccountEventRow[]> {
  const rows = await db<DbAccountEventRow>("account_events").where({ account_id: accountId }).orderBy("id", "desc").limit(limit);
  return rows.map((r) => ({ ...r, id: String(r.id) }));
}

/**
 * The JSON body sent for an event, per the Standard Webhooks payload shape
 * (`type`, `timestamp`, `data`). The same bytes on every attempt. Money in
 * credits, as every surface shows it.
 */
export function eventBody(event: Pick<DbAccountEventRow, "type" | "data" | "at" | "account_id">): string {
  const data: Record<string, unknown> = { account_id: event.account_id };
  for (const [key, value] of Object.entries(event.data)) {
    if (key.endsWith("_units")) {
      const name = key.slice(0, -"_units".length) + "_credits";
      data[name] = Array.isArray(value) ? value.map((v) => unitsToCredits(Number(v))) : unitsToCredits(Number(value));
    } else {
      data[key] = value;
    }
  }
  return JSON.stringify({ type: event.type, timestamp: new Date(event.at).toISOString(), data });
}
