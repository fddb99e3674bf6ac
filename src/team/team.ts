import type { Knex } from "knex";
import { removeMember, type MemberRemoval } from "./member-removal.js";
import { createInvite } from "./invites.js";
import { ensureMember, findMemberByEmail, normalizeEmail, type DbMemberRow } from "./members.js";
import type { Role } from "./roles.js";
import { isUuid } from "../validation.js";

/** The rule the last owner is kept by. */
export const LAST_OWNER_RULE = "an account keeps at least one owner: the last owner cannot be removed or demoted";

/**
 * The live members of an account, each row locked until the transaction
 * ends: two owners demoting each other at once are decided one after the
 * other, so the account never loses its last owner.
 */
async function lockTeam(tx: Knex.Transaction, accountId: string): Promise<DbMemberRow[]> {
  return tx<DbMemberRow>("members").where({ account_id: accountId }).whereNull("removed_at").orderBy("id").forUpdate();
}

function isLastOwner(team: DbMemberRow[], member: DbMemberRow): boolean {
  return member.role === "owner" && team.filter((m) => m.role === "owner").length === 1;
}

/** A live member of the account, for a change; another account's member, an unknown or malformed id are alike undefined. */
export async function findTeamMember(db: Knex | Knex.Transaction, accountId: string, memberId: string): Promise<DbMemberRow | undefined> {
  if (!isUuid(memberId) || !isUuid(accountId)) return undefined;
  return db<DbMemberRow>("members").where({ id: memberId, account_id: accountId }).whereNull("removed_at").first();
}

/**
 * Removes a member of the account (of any account when none is given, as
 * the operator does), unless they are its last owner: their sessions end,
 * their open invites and sign-in challenges stop working, and the keys they
 * created are revoked, or kept and marked by the actor (member-removal.ts),
 * in the caller's transaction. Undefined when no such member is there.
 */
export async function removeTeamMember(
  tx: Knex.Transaction,
  request: { accountId?: string; memberId: string; actor: string; keepKeys: boolean; now: Date },
): Promise<MemberRemoval | "last_owner" | undefined> {
  const { memberId, now } = request;
  if (!isUuid(memberId) || (request.accountId !== undefined && !isUuid(request.accountId))) return undefined;
  const accountId = request.accountId ?? (await tx<DbMemberRow>("members").where({ id: memberId }).whereNull("removed_at").first())?.account_id;
  if (accountId === undefined) return undefined;
  const team = await lockTeam(tx, accountId);
  const target = team.find((m) => m.id === memberId);
  if (!target) return undefined;
  if (isLastOwner(team, target)) return "last_owner";
  const removal = await removeMember(tx, { ...request, accountId });
  await tx("sign_in_challenges").where({ member_id: memberId }).whereNull("used_at").update({ used_at: now });
  return removal;
}

/**
 * Gives a member of the account another role. "last_owner" when it would
 * demote the account's only owner; undefined when no such member is in the
 * account.
 */
export async function changeMemberRole(
  tx: Knex.Transaction,
  accountId: string,
  memberId: string,
  role: Role,
): Promise<{ member: DbMemberRow; previous: Role } | "last_owner" | undefined> {
  if (!isUuid(memberId) || !isUuid(accountId)) return undefined;
  const team = await lockTeam(tx, accountId);
  const target = team.find((m) => m.id === memberId);
  if (!target) return undefined;
  if (role !== "owner" && isLastOwner(team, target)) return "last_owner";
  const [member] = await tx<DbMemberRow>("members").where({ id: memberId }).update({ role }).returning("*");
  return { member: member!, previous: target.role };
}

/** True when the account has a live owner. */
export async function hasOwner(db: Knex | Knex.Transaction, accountId: string): Promise<boolean> {
  if (!isUuid(accountId)) return false;
  return (await db("members").where({ account_id: accountId, role: "owner" }).whereNull("removed_at").first()) !== undefined;
}

/**
 * Invites a person to the account with a role: a new member, or a member
 * who has not accepted yet (the old link stops working and the role is the
 * new one). A member who has accepted is "already_member": a password reset
 * is the operator's, never another member's, or an admin could take over an
 * owner's sign-in. "elsewhere" when the email is a member of another account;
 * "last_owner" when the new role would demote the account's only owner.
 */
export async function inviteTeamMember(
  tx: Knex.Transaction,
  accountId: string,
  email: string,
  role: Role,
  now: Date,
): Promise<{ member: DbMemberRow; invite: { token: string; expiresAt: Date } } | "already_member" | "elsewhere" | "last_owner"> {
  const existing = await findMemberByEmail(tx, normalizeEmail(email));
  if (existing && existing.account_id !== accountId) return "elsewhere";
  if (existing && existing.password_hash !== null) return "already_member";
  let member = existing ?? (await ensureMember(tx, accountId, email, role));
  if (!member) return "elsewhere";
  if (member.role !== role) {
    const changed = await changeMemberRole(tx, accountId, member.id, role);
    if (changed === "last_owner" || changed === undefined) return "last_owner";
    member = changed.member;
  }
  const invite = await createInvite(tx, member.id, now);
  return { member, invite };
}
