import type { Knex } from "knex";
import { AccountService } from "../gen/typesafe/account/v1/account_service_pb.js";
import type { Role } from "../team/roles.js";
import { generateToken, hashToken, isWellFormedToken } from "./secret-tokens.js";

/** The calls that work without a session: they are how one starts or ends. */
export const SESSIONLESS_METHODS: ReadonlySet<string> = new Set([
  AccountService.method.signIn.name,
  AccountService.method.signInSecondStep.name,
  AccountService.method.acceptInvite.name,
  AccountService.method.signOut.name,
]);

/** How long sessions last: ended after `idleMs` unused, and `absoluteMs` after sign-in in any case. */
export interface SessionPolicy {
  idleMs: number;
  absoluteMs: number;
}

/** The member a live session belongs to. */
export interface SessionMember {
  memberId: string;
  accountId: string;
  email: string;
  /** Read with the session on every call: a new role holds from the member's next call. */
  role: Role;
  twoFactorEnabled: boolean;
  /** The account requires a second factor of every member. */
  twoFactorRequired: boolean;
}

/** What a session statement returns of its member, with the account's two-factor rule. */
const MEMBER_COLUMNS = `m.id AS member_id, m.account_id, m.email, m.role, m.totp_enabled_at IS NOT NULL AS two_factor_enabled,
      COALESCE((SELECT st.require_two_factor FROM account_settings st WHERE st.account_id = m.account_id), false) AS two_factor_required`;

/** Starts a session; the token goes in the cookie and only its hash is stored. */
export async function startSession(db: Knex | Knex.Transaction, memberId: string, policy: SessionPolicy, now: Date): Promise<string> {
  const token = generateToken();
  await db("member_sessions").insert({
    token_hash: hashToken(token),
    member_id: memberId,
    created_at: now,
    last_seen_at: now,
    expires_at: new Date(now.getTime() + policy.absoluteMs),
  });
  return token;
}

/**
 * The member of a live session, its idle clock restarted; undefined for an
 * unknown, ended, idle, too old session or a removed member's. One statement:
 * the check and the touch cannot be split by a concurrent sign-out.
 */
export async function resumeSession(db: Knex, token: string, policy: SessionPolicy, now: Date): Promise<SessionMember | undefined> {
  if (!isWellFormedToken(token)) return undefined;
  const result = await db.raw(
    `UPDATE member_sessions s
        SET last_seen_at = :now
       FROM members m
      WHERE s.token_hash = :hash AND s.ended_at IS NULL
        AND s.last_seen_at > :idleCutoff AND s.expires_at > :now
        AND m.id = s.member_id AND m.removed_at IS NULL
    RETURNING ${MEMBER_COLUMNS}`,
    { now, hash: hashToken(token), idleCutoff: new Date(now.getTime() - policy.idleMs) },
  );
  return memberOfRow(result.rows[0]);
}

/** Ends one session at once (sign-out); the member whose live session it was, or undefined. */
export async function endSession(db: Knex | Knex.Transaction, token: string, now: Date): Promise<SessionMember | undefined> {
  if (!isWellFormedToken(token)) return undefined;
  const result = await db.raw(
    `UPDATE member_sessions s SET ended_at = :now FROM members m
      WHERE s.token_hash = :hash AND s.ended_at IS NULL AND m.id = s.member_id
    RETURNING ${MEMBER_COLUMNS}`,
    { now, hash: hashToken(token) },
  );
  return memberOfRow(result.rows[0]);
}

/** The member a session statement returned, if it returned one. */
function memberOfRow(row: DbSessionMemberRow | undefined): SessionMember | undefined {
  return (
    row && {
      memberId: row.member_id,
      accountId: row.account_id,
      email: row.email,
      role: row.role,
      twoFactorEnabled: row.two_factor_enabled,
      twoFactorRequired: row.two_factor_required,
    }
  );
}

interface DbSessionMemberRow {
  member_id: string;
  account_id: string;
  email: string;
  role: Role;
  two_factor_enabled: boolean;
  two_factor_required: boolean;
}

/** Ends every session of a member at once (removal, a new password), or every one but the session `keep` names (a second factor turned on). */
export async function endMemberSessions(db: Knex | Knex.Transaction, memberId: string, now: Date, keep?: { token: string }): Promise<number> {
  const live = db("member_sessions").where({ member_id: memberId }).whereNull("ended_at");
  if (keep && isWellFormedToken(keep.token)) live.whereNot({ token_hash: hashToken(keep.token) });
  return live.update({ ended_at: now });
}

/** Sessions that are live now across all accounts (for the metrics gauge). */
export async function countLiveSessions(db: Knex, policy: SessionPolicy, now: Date): Promise<number> {
  const row = await db("member_sessions")
    .whereNull("ended_at")
    .where("last_seen_at", ">", new Date(now.getTime() - policy.idleMs))
    .where("expires_at", ">", now)
    .count<{ count: string }[]>({ count: "*" })
    .first();
  return Number(row?.count ?? 0);
}
