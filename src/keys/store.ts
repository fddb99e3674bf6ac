import type { Knex } from "knex";
import { isUuid } from "../validation.js";
import { displayPrefix, generateApiKey, hashApiKey } from "./api-keys.js";

/** The longest key name. */
export const MAX_KEY_NAME_CHARS = 64;

export interface DbApiKeyRow {
  id: string;
  account_id: string;
  display_prefix: string;
  /** The name its creator gave it, or empty. */
  name: string;
  /** The key's last 4 characters; empty for keys made before they were kept. */
  last4: string;
  /** The email of the member who made it, or "operator". */
  created_by: string;
  created_at: Date;
  revoked_at: Date | null;
  /** When it stops working; null for never (the key's other limits: key-limits.ts). */
  expires_at: Date | null;
  /** Who kept the key working when its creator was removed (member-removal.ts), or null. */
  kept_by: string | null;
  kept_at: Date | null;
}

/** A key as the account area lists it: its row, its limits with what it spent, and when a call last used it. */
export interface AccountKeyRow extends DbApiKeyRow, KeyLimitsRow {
  last_used_at: Date | null;
}

/** A key's limits and what it spent, as the account area and the CLI show them. */
export interface KeyLimitsRow {
  expires_at: Date | null;
  scopes: ("decisions" | "search")[] | null;
  budget_units: number | null;
  budget_period: "day" | "week" | "month" | "total" | null;
  rate_limit: number | null;
  /** Charged in the current period (0 without a budget). */
  spent_units: number;
  /** Held by its calls in flight. */
  held_units: number;
  /** Start of the current budget period; null without a budget or for a total one. */
  period_start: Date | null;
}

/** SQL selecting KeyLimitsRow's columns of the key aliased `k` (the metering functions compute spent and held). */
export const KEY_LIMIT_SELECTS = [
  "k.scopes",
  "k.budget_units",
  "k.budget_period",
  "k.rate_limit",
  "CASE WHEN k.budget_units IS NULL THEN 0 ELSE metering_key_spent(k.budget_spent, k.budget_period_start, k.budget_period, now()) END AS spent_units",
  "CASE WHEN k.budget_units IS NULL THEN 0 ELSE metering_key_held(k.account_id, k.id) END AS held_units",
  "CASE WHEN k.budget_period IN ('day', 'week', 'month') THEN metering_key_period_start(k.budget_period, now()) END AS period_start",
];

/** Issues a new key; the clear key is returned once and only its hash is stored. */
export async function createApiKey(
  db: Knex | Knex.Transaction,
  accountId: string,
  init: { name?: string; createdBy?: string } = {},
): Promise<{ keyId: string; apiKey: string; row: DbApiKeyRow }> {
  const apiKey = generateApiKey();
  const [row] = await db<DbApiKeyRow>("api_keys")
    .insert({
      account_id: accountId,
      key_hash: hashApiKey(apiKey),
      display_prefix: displayPrefix(apiKey),
      name: init.name ?? "",
      last4: apiKey.slice(-4),
      created_by: init.createdBy ?? "operator",
    } as Partial<DbApiKeyRow>)
    // A new key has no expiry until its limits are set and was kept by nobody; not read back, so this works on the schemas
    // before limits and kept keys too (the benches' older builds and schemas).
    .returning(KEY_COLUMNS.filter((column) => !NEW_KEY_NULLS.includes(column)));
  return { keyId: row!.id, apiKey, row: { ...row!, expires_at: null, kept_by: null, kept_at: null } };
}

const KEY_COLUMNS = ["id", "account_id", "display_prefix", "name", "last4", "created_by", "created_at", "revoked_at", "expires_at", "kept_by", "kept_at"] as const;
/** The key columns that are NULL on a new key, and came with migrations after the key itself. */
const NEW_KEY_NULLS: readonly string[] = ["expires_at", "kept_by", "kept_at"];

/** Where a page of keys starts: after this key (exclusive), newest first. */
export interface KeyCursor {
  createdAt: Date;
  id: string;
}

/** A page of the account's keys, newest first, each with the time of its newest call (the requests' key index), and whether more follow. */
export async function listAccountKeys(
  db: Knex | Knex.Transaction,
  accountId: string,
  page: { size: number; after?: KeyCursor },
): Promise<{ keys: AccountKeyRow[]; more: boolean }> {
  if (!isUuid(accountId) || (page.after && !isUuid(page.after.id))) return { keys: [], more: false };
  const query = accountKeys(db).where("k.account_id", accountId);
  // A cursor's time is a JavaScript Date (milliseconds) and created_at has microseconds: order and compare at the cursor's precision, or keys made in the page's last millisecond would be skipped.
  if (page.after) query.whereRaw("(date_trunc('milliseconds', k.created_at), k.id) < (?, ?)", [page.after.createdAt, page.after.id]);
  const rows: AccountKeyRow[] = await query.orderByRaw("date_trunc('milliseconds', k.created_at) desc, k.id desc").limit(page.size + 1);
  return { keys: rows.slice(0, page.size), more: rows.length > page.size };
}

/** One key of this account as the account area lists it, or undefined (another account's, unknown, malformed). */
export async function findAccountKey(db: Knex | Knex.Transaction, accountId: string, keyId: string): Promise<AccountKeyRow | undefined> {
  if (!isUuid(keyId) || !isUuid(accountId)) return undefined;
  return accountKeys(db).where("k.account_id", accountId).where("k.id", keyId).first();
}

function accountKeys(db: Knex | Knex.Transaction): Knex.QueryBuilder {
  return db("api_keys as k")
    .select(KEY_COLUMNS.map((c) => `k.${c}`))
    .select(KEY_LIMIT_SELECTS.map((select) => db.raw(select)))
    .select(db.raw("(SELECT max(r.created_at) FROM requests r WHERE r.key_id = k.id) AS last_used_at"));
}

/**
 * Serializes key creation within one account for the rest of the
 * transaction, and counts its live keys: two creations at once cannot both
 * pass a cap. An advisory lock, not the account row, which every call locks.
 */
export async function countLiveKeysLocked(tx: Knex.Transaction, accountId: string): Promise<number> {
  await tx.raw("SELECT pg_advisory_xact_lock(hashtextextended(?, 36))", [accountId]);
  const row = await tx("api_keys").where({ account_id: accountId }).whereNull("revoked_at").count<{ count: string }[]>({ count: "*" }).first();
  return Number(row?.count ?? 0);
}

/**
 * Revokes a key of this account; another account's key, an unknown id and a
 * malformed one are all undefined alike. Revoking twice keeps the first time
 * (`revokedNow` is then false).
 */
export async function revokeAccountKey(
  db: Knex | Knex.Transaction,
  accountId: string,
  keyId: string,
  now: Date,
): Promise<{ key: AccountKeyRow; revokedNow: boolean } | undefined> {
  if (!isUuid(keyId) || !isUuid(accountId)) return undefined;
  const updated = await db("api_keys").where({ id: keyId, account_id: accountId }).whereNull("revoked_at").update({ revoked_at: now }).returning("id");
  const key = await findAccountKey(db, accountId, keyId);
  return key && { key, revokedNow: updated.length > 0 };
}

/** Revokes a key from the next request on: nothing caches keys. Returns false for an unknown key id (the operator's revoke, of any account). */
export async function revokeApiKey(db: Knex | Knex.Transaction, keyId: string): Promise<boolean> {
  if (!isUuid(keyId)) return false;
  const updated = await db("api_keys")
    .where({ id: keyId })
    .update({ revoked_at: db.raw("COALESCE(revoked_at, now())") })
    .returning("id");
  return updated.length > 0;
}

/** The account's keys, oldest first (the operator's listing). */
export async function listApiKeys(db: Knex | Knex.Transaction, accountId: string): Promise<DbApiKeyRow[]> {
  return db<DbApiKeyRow>("api_keys")
    .select([...KEY_COLUMNS] as (keyof DbApiKeyRow)[])
    .where({ account_id: accountId })
    .orderBy("created_at");
}

/** The account, id and expiry of a key that is not revoked, or undefined for an unknown or revoked key. */
export async function findLiveKeyByHash(
  db: Knex | Knex.Transaction,
  keyHash: Buffer,
): Promise<{ accountId: string; keyId: string; expiresAt: Date | null } | undefined> {
  const row = await db("api_keys").select("account_id", "id", "expires_at").where({ key_hash: keyHash }).whereNull("revoked_at").first();
  return row && { accountId: row.account_id as string, keyId: row.id as string, expiresAt: row.expires_at as Date | null };
}
