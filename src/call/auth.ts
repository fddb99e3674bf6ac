import type { Knex } from "knex";
import { hashApiKey } from "../accounts/api-keys.js";
import { findAccountIdByKeyHash } from "../accounts/store.js";
import { apiError } from "../errors.js";

/** The key's shape is checked once per call by the request contract; the services read it from there. */
export { requireApiKey } from "../request/api-key.js";

/** Checks that the key exists and is not revoked; no cache, so revocation is immediate. */
export async function authenticate(db: Knex, apiKey: string): Promise<string> {
  const accountId = await findAccountIdByKeyHash(db, hashApiKey(apiKey));
  if (!accountId) throw apiError("UNAUTHENTICATED", "invalid API key: unknown or revoked");
  return accountId;
}
