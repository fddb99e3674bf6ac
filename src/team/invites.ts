import type { Knex } from "knex";
import { generateToken, hashToken, isWellFormedToken } from "../sign-in/secret-tokens.js";

/** Where invite links point: the account page reads the token from its query. */
export const INVITE_PATH = "/account/?invite=";

/** The link a person opens to accept an invite, at the service's public URL. */
export function inviteUrl(publicUrl: string, token: string): string {
  return `${publicUrl}${INVITE_PATH}${token}`;
}

/** How long an invite can be accepted. */
export const INVITE_TTL_MS = 24 * 3_600_000;

/**
 * Issues an invite for a member: a random token returned this once, stored
 * hashed, usable once before `now + INVITE_TTL_MS`. Earlier unused invites of
 * the member stop working, so only the newest link is live.
 */
export async function createInvite(db: Knex.Transaction, memberId: string, now: Date): Promise<{ token: string; expiresAt: Date }> {
  const token = generateToken();
  const expiresAt = new Date(now.getTime() + INVITE_TTL_MS);
  await db("member_invites").where({ member_id: memberId }).whereNull("used_at").update({ used_at: now });
  await db("member_invites").insert({ token_hash: hashToken(token), member_id: memberId, created_at: now, expires_at: expiresAt });
  return { token, expiresAt };
}

/**
 * The member id of a live invite, read without using it: an invite that
 * cannot be accepted is refused before any password work is done for it.
 * consumeInvite still decides, in the transaction that sets the password.
 */
export async function findLiveInvite(db: Knex | Knex.Transaction, token: string, now: Date): Promise<string | undefined> {
  if (!isWellFormedToken(token)) return undefined;
  const row = await db("member_invites as i")
    .select("i.member_id")
    .where("i.token_hash", hashToken(token))
    .whereNull("i.used_at")
    .where("i.expires_at", ">", now)
    .whereExists(db("members as m").select(db.raw("1")).whereRaw("m.id = i.member_id").whereNull("m.removed_at"))
    .first();
  return row?.member_id as string | undefined;
}

/**
 * Uses an invite: the member id of a live, unused, unexpired invite of a
 * member not removed, marked used in the same statement so that two
 * acceptances of one token cannot both succeed. Anything else is undefined,
 * with no hint of which rule failed.
 */
export async function consumeInvite(db: Knex.Transaction, token: string, now: Date): Promise<string | undefined> {
  if (!isWellFormedToken(token)) return undefined;
  const rows = await db("member_invites as i")
    .update({ used_at: now })
    .where("i.token_hash", hashToken(token))
    .whereNull("i.used_at")
    .where("i.expires_at", ">", now)
    .whereExists(db("members as m").select(db.raw("1")).whereRaw("m.id = i.member_id").whereNull("m.removed_at"))
    .returning("i.member_id");
  return rows[0]?.member_id as string | undefined;
}
