import type { HandlerContext } from "@connectrpc/connect";
import type { Knex } from "knex";
import { bearerToken, hashApiKey, isWellFormedApiKey } from "../accounts/api-keys.js";
import { findAccountIdByKeyHash } from "../accounts/store.js";
import { apiError } from "../errors.js";

/**
 * The caller's API key from `authorization: Bearer <key>` (HTTP header or gRPC
 * metadata). Shape and checksum are checked here, without the database, so a
 * malformed key never costs a round trip.
 */
export function requireApiKey(ctx: HandlerContext): string {
  const header = ctx.requestHeader.get("authorization");
  if (!header) throw apiError("UNAUTHENTICATED", "missing API key: send Authorization: Bearer <key>");
  const key = bearerToken(header);
  if (!key || !isWellFormedApiKey(key)) {
    throw apiError("UNAUTHENTICATED", "malformed API key: expected Authorization: Bearer ts_live_...");
  }
  return key;
}

/** Checks that the key exists and is not revoked; no cache, so revocation is immediate. */
export async function authenticate(db: Knex, apiKey: string): Promise<string> {
  const accountId = await findAccountIdByKeyHash(db, hashApiKey(apiKey));
  if (!accountId) throw apiError("UNAUTHENTICATED", "invalid API key: unknown or revoked");
  return accountId;
}
