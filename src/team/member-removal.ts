import type { Knex } from "knex";
import { recordActivity } from "./activity.js";
import { markMemberRemoved, type DbMemberRow } from "./members.js";
import { endMemberSessions } from "../sign-in/sessions.js";
import { isUuid } from "../validation.js";

/** A key that a removal revoked or kept, as the removal's answer lists it. */
export interface RemovedMemberKey {
  id: string;
  name: string;
  display_prefix: string;
  last4: string;
}

export interface MemberRemoval {
  member: DbMemberRow;
  sessionsEnded: number;
  /** The member's live keys, revoked by the removal (empty when kept). */
  keysRevoked: RemovedMemberKey[];
  /** The member's live keys, kept working because the remover chose so (empty otherwise). */
  keysKept: RemovedMemberKey[];
}

/**
 * Removes a member, in the caller's transaction: their sessions end and
 * their open invites stop working at once, and the live keys they created
 * are revoked, each in the activity log, unless `keepKeys`: then those keys
 * go on working, marked as kept by `actor`. With `accountId`, a member of
 * another account is not found (undefined), as an unknown or malformed id;
 * the operator's CLI passes none. Who may remove whom is the caller's rule.
 */
export async function removeMember(
  tx: Knex.Transaction,
  request: { memberId: string; accountId?: string; actor: string; keepKeys: boolean; now: Date },
): Promise<MemberRemoval | undefined> {
  const { memberId, accountId, actor, keepKeys, now } = request;
  if (!isUuid(memberId) || (accountId !== undefined && !isUuid(accountId))) return undefined;
  const member = await markMemberRemoved(tx, memberId, now, accountId);
  if (!member) return undefined;
  const sessionsEnded = await endMemberSessions(tx, member.id, now);
  await tx("member_invites").where({ member_id: member.id }).whereNull("used_at").update({ used_at: now });
  const theirKeys = tx("api_keys").where({ account_id: member.account_id, created_by: member.email }).whereNull("revoked_at");
  const columns = ["id", "name", "display_prefix", "last4"];
  const touched: RemovedMemberKey[] = keepKeys
    ? await theirKeys.update({ kept_by: actor, kept_at: now }).returning(columns)
    : await theirKeys.update({ revoked_at: now }).returning(columns);
  touched.sort((a, b) => (a.id < b.id ? -1 : 1));
  await recordActivity(tx, { accountId: member.account_id, kind: "member_removed", actor, detail: member.email, at: now });
  if (!keepKeys) {
    for (const key of touched) {
      await recordActivity(tx, { accountId: member.account_id, kind: "key_revoked", actor, detail: `${key.display_prefix}…${key.last4}${key.name ? ` (${key.name})` : ""}`, at: now });
    }
  }
  return { member, sessionsEnded, keysRevoked: keepKeys ? [] : touched, keysKept: keepKeys ? touched : [] };
}
