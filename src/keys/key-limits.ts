import type { Knex } from "knex";
import { creditsNumberToUnits, unitsToCredits } from "../units.js";
import type { Violation } from "../validation.js";
import { recordActivity } from "../team/activity.js";
import { createApiKey, type DbApiKeyRow, type KeyLimitsRow } from "./store.js";
import { isUuid } from "../validation.js";

/**
 * What one API key may do, beside its account's own limits: when it stops,
 * which endpoints it may call, how many units it may be charged per period,
 * and how many calls per rolling minute. The metering functions enforce them
 * at admission (metering_admit_v2); this module sets them, checks them and
 * reads them back with what the key spent.
 */
export type KeyScope = "decisions" | "search";
export const KEY_SCOPES: readonly KeyScope[] = ["decisions", "search"];
export type KeyBudgetPeriod = "day" | "week" | "month" | "total";
export const KEY_BUDGET_PERIODS: readonly KeyBudgetPeriod[] = ["day", "week", "month", "total"];

/** The longest grace a roll gives the old key: 7 days, as Stripe's roll offers. */
export const MAX_ROLL_GRACE_SECONDS = 7 * 86_400;

export interface KeyLimits {
  /** When the key stops working; null for never. */
  expiresAt: Date | null;
  /** Never empty; both by default. */
  scopes: KeyScope[];
  /** Units per period; null for no budget. */
  budget: { units: number; period: KeyBudgetPeriod } | null;
  /** Calls per rolling minute; null for the account's. */
  rateLimit: number | null;
}

export const NO_KEY_LIMITS: KeyLimits = { expiresAt: null, scopes: [...KEY_SCOPES], budget: null, rateLimit: null };

/** Limits as a request states them: credits as a number, strings unchecked. */
export interface KeyLimitsInput {
  expiresAt?: Date;
  scopes: readonly string[];
  budgetCredits?: number;
  budgetPeriod: string;
  /** 0 for the account's. */
  rateLimit: number;
}

/**
 * Checks limits as a caller sent them (field names under `fieldPath`, the JSON
 * path of the limits) and converts them; the account's rate limit bounds the
 * key's. Returns the violations, or the limits when there are none.
 */
export function parseKeyLimits(
  input: KeyLimitsInput,
  context: { now: Date; accountRateLimit: number; fieldPath: string },
): { limits: KeyLimits; violations: [] } | { violations: Violation[] } {
  const { fieldPath } = context;
  const violations: Violation[] = [];
  if (input.expiresAt && !(input.expiresAt.getTime() > context.now.getTime())) {
    violations.push({ field: `${fieldPath}.expires_at`, rule: "must be in the future" });
  }
  const scopes = input.scopes.length === 0 ? [...KEY_SCOPES] : [...new Set(input.scopes)];
  if (scopes.some((scope) => !KEY_SCOPES.includes(scope as KeyScope))) {
    violations.push({ field: `${fieldPath}.scopes`, rule: 'each one of "decisions", "search"; empty means both' });
  }
  let budget: KeyLimits["budget"] = null;
  if (input.budgetCredits !== undefined) {
    const whole = creditsNumberToUnits(input.budgetCredits);
    if (whole === undefined) {
      violations.push({ field: `${fieldPath}.budget_credits`, rule: "a number of credits from 0, with at most 6 decimals" });
    } else if (!KEY_BUDGET_PERIODS.includes(input.budgetPeriod as KeyBudgetPeriod)) {
      violations.push({ field: `${fieldPath}.budget_period`, rule: 'with a budget: "day", "week", "month" (UTC) or "total"' });
    } else {
      budget = { units: whole, period: input.budgetPeriod as KeyBudgetPeriod };
    }
  } else if (input.budgetPeriod !== "") {
    violations.push({ field: `${fieldPath}.budget_period`, rule: "only with budget_credits" });
  }
  if (!Number.isInteger(input.rateLimit) || input.rateLimit < 0 || input.rateLimit > context.accountRateLimit) {
    violations.push({
      field: `${fieldPath}.requests_per_minute`,
      rule: `from 1 to the account's ${context.accountRateLimit}, or 0 for the account's`,
    });
  }
  if (violations.length > 0) return { violations };
  return {
    limits: { expiresAt: input.expiresAt ?? null, scopes: scopes as KeyScope[], budget, rateLimit: input.rateLimit === 0 ? null : input.rateLimit },
    violations: [],
  };
}

/** The columns of a key's limits; every scope is stored as NULL (all), as keys made before limits have. */
function limitColumns(limits: KeyLimits) {
  return {
    expires_at: limits.expiresAt,
    scopes: KEY_SCOPES.every((scope) => limits.scopes.includes(scope)) ? null : limits.scopes,
    budget_units: limits.budget?.units ?? null,
    budget_period: limits.budget?.period ?? null,
    rate_limit: limits.rateLimit,
  };
}

/** The limits of a read row. */
export function keyLimitsOf(row: KeyLimitsRow): KeyLimits {
  return {
    expiresAt: row.expires_at,
    scopes: row.scopes ?? [...KEY_SCOPES],
    budget: row.budget_units === null || row.budget_period === null ? null : { units: Number(row.budget_units), period: row.budget_period },
    rateLimit: row.rate_limit,
  };
}

/** The end of the budget period that starts at `start`, in UTC (exclusive). */
export function periodEnd(period: KeyBudgetPeriod, start: Date): Date | null {
  const end = new Date(start);
  if (period === "day") end.setUTCDate(end.getUTCDate() + 1);
  else if (period === "week") end.setUTCDate(end.getUTCDate() + 7);
  else if (period === "month") end.setUTCMonth(end.getUTCMonth() + 1);
  else return null;
  return end;
}

/**
 * Sets the limits of a key of this account (not revoked); undefined for any
 * other. The account's row is locked first, as every metering function does,
 * so no settle of the key interleaves. When the budget changes, what the key
 * was charged since the start of the current period is counted again from
 * its settled calls: a budget set mid-month counts the month's earlier spend.
 */
export async function setKeyLimits(tx: Knex.Transaction, accountId: string, keyId: string, limits: KeyLimits): Promise<DbApiKeyRow | undefined> {
  if (!isUuid(accountId) || !isUuid(keyId)) return undefined;
  await tx.raw("SELECT 1 FROM accounts WHERE id = ? FOR UPDATE", [accountId]);
  const [row] = await tx("api_keys")
    .where({ id: keyId, account_id: accountId })
    .whereNull("revoked_at")
    .update({ ...limitColumns(limits), ...(limits.budget ? recountedSpend(tx, limits.budget.period) : {}) })
    .returning("*");
  return row as DbApiKeyRow | undefined;
}

/**
 * Sets a key's limits as `setKeyLimits` does and, when any of them changed,
 * records who changed what in the account's activity, in the same
 * transaction. Undefined for a key that is not this account's or is revoked.
 */
export async function changeKeyLimits(
  tx: Knex.Transaction,
  accountId: string,
  keyId: string,
  limits: KeyLimits,
  change: { actor: string; at: Date },
): Promise<DbApiKeyRow | undefined> {
  if (!isUuid(accountId) || !isUuid(keyId)) return undefined;
  // The account first, as every metering function locks: what is read here is what the update replaces.
  await tx.raw("SELECT 1 FROM accounts WHERE id = ? FOR UPDATE", [accountId]);
  const before = await tx("api_keys").where({ id: keyId, account_id: accountId }).whereNull("revoked_at").first();
  if (!before) return undefined;
  const row = await setKeyLimits(tx, accountId, keyId, limits);
  const changes = keyLimitChanges(keyLimitsOf(before), limits);
  if (row && changes.length > 0) {
    await recordActivity(tx, { accountId, kind: "key_limits_changed", actor: change.actor, detail: `${keyLabel(row)}: ${changes.join("; ")}`, at: change.at });
  }
  return row;
}

/** How the activity list names a key: its display prefix and last 4, and its name. */
export function keyLabel(key: { display_prefix: string; last4: string; name: string }): string {
  return `${key.display_prefix}…${key.last4}${key.name ? ` (${key.name})` : ""}`;
}

/** Each limit that differs, as "what: before → after"; empty when none does. */
export function keyLimitChanges(before: KeyLimits, after: KeyLimits): string[] {
  const text = {
    expiry: (l: KeyLimits) => (l.expiresAt ? l.expiresAt.toISOString() : "never"),
    scopes: (l: KeyLimits) => KEY_SCOPES.filter((scope) => l.scopes.includes(scope)).join(", "),
    budget: (l: KeyLimits) => (l.budget ? `${unitsToCredits(l.budget.units)} credits ${l.budget.period === "total" ? "in total" : `a ${l.budget.period}`}` : "none"),
    "rate limit": (l: KeyLimits) => (l.rateLimit === null ? "the account's" : `${l.rateLimit} a minute`),
  };
  return Object.entries(text).flatMap(([what, show]) => (show(before) === show(after) ? [] : [`${what} ${show(before)} → ${show(after)}`]));
}

/**
 * The key's charges in its current budget period, from its settled calls, as
 * columns of the same UPDATE as the limits: the budget trigger then judges
 * the new budget against this period's spend, never a stale one.
 */
function recountedSpend(tx: Knex.Transaction, period: KeyBudgetPeriod) {
  return {
    budget_period_start: tx.raw("metering_key_period_start(?, now())", [period]),
    budget_spent: tx.raw(
      `(SELECT coalesce(sum(r.charged), 0) FROM requests r
         WHERE r.key_id = api_keys.id AND r.status = 'settled' AND r.resolved_at >= metering_key_period_start(?, now()))`,
      [period],
    ),
  };
}

/**
 * Rolls a key: a new secret with the same name and limits, whose budget
 * carries on the old one's spend of the period (a roll never refills a
 * budget); the old key stops `graceSeconds` from `now` (or sooner, if it
 * already expires sooner). Undefined for a key that is not this account's or
 * no longer works.
 */
export async function rollKey(
  tx: Knex.Transaction,
  accountId: string,
  keyId: string,
  init: { graceSeconds: number; now: Date; createdBy: string },
): Promise<{ apiKey: string; newKeyId: string; oldKey: DbApiKeyRow; newKey: DbApiKeyRow } | undefined> {
  if (!isUuid(accountId) || !isUuid(keyId)) return undefined;
  await tx.raw("SELECT 1 FROM accounts WHERE id = ? FOR UPDATE", [accountId]);
  const old = await tx("api_keys")
    .where({ id: keyId, account_id: accountId })
    .whereNull("revoked_at")
    .where((q) => q.whereNull("expires_at").orWhere("expires_at", ">", init.now))
    .first();
  if (!old) return undefined;
  const created = await createApiKey(tx, accountId, { name: old.name, createdBy: init.createdBy });
  const [newKey] = await tx("api_keys")
    .where({ id: created.keyId })
    .update({
      expires_at: old.expires_at,
      scopes: old.scopes,
      budget_units: old.budget_units,
      budget_period: old.budget_period,
      rate_limit: old.rate_limit,
      budget_spent: old.budget_spent,
      budget_period_start: old.budget_period_start,
      // The successor carries on the period's spend, and so whether its budget_reached was recorded.
      budget_reached_in: old.budget_reached_in,
    })
    .returning("*");
  const stopsAt = new Date(init.now.getTime() + init.graceSeconds * 1000);
  const [oldKey] = await tx("api_keys")
    .where({ id: keyId })
    .update({ expires_at: old.expires_at && old.expires_at < stopsAt ? old.expires_at : stopsAt })
    .returning("*");
  return { apiKey: created.apiKey, newKeyId: created.keyId, oldKey: oldKey as DbApiKeyRow, newKey: newKey as DbApiKeyRow };
}
