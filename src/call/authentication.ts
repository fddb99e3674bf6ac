import { createContextKey, type HandlerContext } from "@connectrpc/connect";
import type { Knex } from "knex";
import { apiError } from "../errors.js";
import { apiKeyFrom, hashApiKey } from "../keys/api-keys.js";
import { findLiveKeyByHash } from "../keys/store.js";

/** The caller's API key once its shape was checked at the door, so later steps of the call do not check it again. */
export const kApiKey = createContextKey<string | undefined>(undefined, { description: "API key of well-formed shape" });

/** The call's well-formed API key: the one the door checked, else checked now (and kept for the rest of the call); throws UNAUTHENTICATED. */
export function requireApiKey(ctx: HandlerContext): string {
  const checked = ctx.values.get(kApiKey);
  if (checked !== undefined) return checked;
  const result = apiKeyFrom(ctx.requestHeader.get("authorization"));
  if ("error" in result) throw result.error;
  ctx.values.set(kApiKey, result.key);
  return result.key;
}

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
