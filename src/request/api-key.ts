import { createContextKey, type ConnectError, type HandlerContext } from "@connectrpc/connect";
import { bearerToken, isWellFormedApiKey } from "../accounts/api-keys.js";
import { apiError } from "../errors.js";

/** The caller's API key once its shape was checked at the door, so later steps of the call do not check it again. */
export const kApiKey = createContextKey<string | undefined>(undefined, { description: "API key of well-formed shape" });

/**
 * The key of an `authorization: Bearer <key>` header (HTTP header or gRPC
 * metadata), or the UNAUTHENTICATED error saying what is wrong with it. Shape
 * and checksum only, without the database, so a malformed key never costs a
 * round trip.
 */
export function apiKeyFrom(authorization: string | null | undefined): { key: string } | { error: ConnectError } {
  if (!authorization) return { error: apiError("UNAUTHENTICATED", "missing API key: send Authorization: Bearer <key>") };
  const key = bearerToken(authorization);
  if (!key || !isWellFormedApiKey(key)) return { error: apiError("UNAUTHENTICATED", "malformed API key: expected Authorization: Bearer ts_live_...") };
  return { key };
}

/** The call's well-formed API key: the one the door checked, else checked now (and kept for the rest of the call); throws UNAUTHENTICATED. */
export function requireApiKey(ctx: HandlerContext): string {
  const checked = ctx.values.get(kApiKey);
  if (checked !== undefined) return checked;
  const result = apiKeyFrom(ctx.requestHeader.get("authorization"));
  if ("error" in result) throw result.error;
  ctx.values.set(kApiKey, result.key);
  return result.key;
}
