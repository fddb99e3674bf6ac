import type { Knex } from "knex";
import { displayPrefix, generateApiKey, hashApiKey } from "./api-keys.js";

/** A row of `accounts`; money columns are integer units. */
export interface DbAccountRow {
  id: string;
  name: string;
  balance: number;
  reserved: number;
  free_remaining: number;
  free_reserved: number;
  in_flight: number;
  created_at: Date;
}

export interface DbApiKeyRow {
  id: string;
  account_id: string;
  display_prefix: string;
  created_at: Date;
  revoked_at: Date | null;
}

/** Inserts an account row with empty balances; its opening credits are granted by the caller, through metering. */
export async function insertAccount(db: Knex | Knex.Transaction, name: string): Promise<DbAccountRow> {
  const [account] = await db<DbAccountRow>("accounts").insert({ name }).returning("*");
  return account!;
}

export async function findAccount(db: Knex | Knex.Transaction, accountId: string): Promise<DbAccountRow | undefined> {
  if (!isUuid(accountId)) return undefined;
  return db<DbAccountRow>("accounts").where({ id: accountId }).first();
}

/** Issues a new key; the clear key is returned once and only its hash is stored. */
export async function createApiKey(
  db: Knex | Knex.Transaction,
  accountId: string,
): Promise<{ keyId: string; apiKey: string }> {
  const apiKey = generateApiKey();
  const [row] = await db("api_keys")
    .insert({ account_id: accountId, key_hash: hashApiKey(apiKey), display_prefix: displayPrefix(apiKey) })
    .returning("id");
  return { keyId: row!.id as string, apiKey };
}

/** Revokes a key from the next request on: nothing caches keys. Returns false for an unknown key id. */
export async function revokeApiKey(db: Knex | Knex.Transaction, keyId: string): Promise<boolean> {
  if (!isUuid(keyId)) return false;
  const updated = await db("api_keys")
    .where({ id: keyId })
    .update({ revoked_at: db.raw("COALESCE(revoked_at, now())") })
    .returning("id");
  return updated.length > 0;
}

export async function listApiKeys(db: Knex | Knex.Transaction, accountId: string): Promise<DbApiKeyRow[]> {
  return db<DbApiKeyRow>("api_keys")
    .select("id", "account_id", "display_prefix", "created_at", "revoked_at")
    .where({ account_id: accountId })
    .orderBy("created_at");
}

/** The account of a live key, or undefined for an unknown or revoked key. */
export async function findAccountIdByKeyHash(db: Knex | Knex.Transaction, keyHash: Buffer): Promise<string | undefined> {
  const row = await db("api_keys").select("account_id").where({ key_hash: keyHash }).whereNull("revoked_at").first();
  return row?.account_id as string | undefined;
}

/** True for a UUID in its text form, the shape of account and key ids (a cast of anything else would fail in SQL). */
export function isUuid(text: string): boolean {
  return /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(text);
}
