import type { Knex } from "knex";
import { hashApiKey } from "../accounts/api-keys.js";
import { findLiveKeyByHash } from "../accounts/store.js";
import { apiError } from "../errors.js";

/** The key's shape is checked once per call by the request contract; the services read it from there. */
export { requireApiKey } from "../request/api-key.js";

/**
 * Checks that the key exists, is not revoked and has not expired, for calls
 * that are not metered (a metered call's admission checks the same, and more);
 * no cache, so revocation is immediate.
 */
export async function authenticate(db: Knex, apiKey: string, now: Date = new Date()): Promise<string> {
  const key = await findLiveKeyByHash(db, hashApiKey(apiKey));
  if (!key) throw apiError("UNAUTHENTICATED", "invalid API key: unknown or revoked");
  if (key.expiresAt && key.expiresAt.getTime() <= now.getTime()) {
    throw apiError("KEY_EXPIRED", `this API key expired at ${key.expiresAt.toISOString()}`, {
      metadata: { key_id: key.keyId, expired_at: key.expiresAt.toISOString() },
    });
  }
  return key.accountId;
}
