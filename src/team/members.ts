import type { Knex } from "knex";
import type { Role } from "./roles.js";
import { isUuid } from "../validation.js";

/** A row of `members`: a person who may sign in to one account. */
export interface DbMemberRow {
  id: string;
  account_id: string;
  email: string;
  /** Absent until the member accepts their invite. */
  password_hash: string | null;
  created_at: Date;
  removed_at: Date | null;
  role: Role;
  /** The confirmed TOTP secret (base32); absent while the member has no second factor. */
  totp_secret: string | null;
  /** A secret shown for enrollment and not yet confirmed with a code. */
  totp_pending_secret: string | null;
  totp_enabled_at: Date | null;
  /** The TOTP time step last accepted: a code of that step or earlier is never accepted again. */
  totp_last_step: number | null;
}

/** The most an email address may be (RFC 5321's path limit). */
export const MAX_EMAIL_CHARS = 254;

/** Emails are compared case-insensitively: stored and looked up in lower case, trimmed. */
export function normalizeEmail(email: string): string {
  return email.trim().toLowerCase();
}

/** Which rule an email breaks, or undefined: one "@" with text on both sides, no spaces, not too long. */
export function emailProblem(email: string): string | undefined {
  if (email.length > MAX_EMAIL_CHARS) return `at most ${MAX_EMAIL_CHARS} characters`;
  if (!/^[^\s@]+@[^\s@]+$/.test(email)) return "an email address (name@domain)";
  return undefined;
}

/** The live member with this email (normalized), or undefined. */
export async function findMemberByEmail(db: Knex | Knex.Transaction, email: string): Promise<DbMemberRow | undefined> {
  return db<DbMemberRow>("members").where({ email: normalizeEmail(email) }).whereNull("removed_at").first();
}

/** A live member of the account by id; another account's member or a malformed id is undefined. */
export async function findMember(db: Knex | Knex.Transaction, memberId: string): Promise<DbMemberRow | undefined> {
  if (!isUuid(memberId)) return undefined;
  return db<DbMemberRow>("members").where({ id: memberId }).whereNull("removed_at").first();
}

/** The live members of an account, oldest first. */
export async function listMembers(db: Knex | Knex.Transaction, accountId: string): Promise<DbMemberRow[]> {
  if (!isUuid(accountId)) return [];
  return db<DbMemberRow>("members").where({ account_id: accountId }).whereNull("removed_at").orderBy([{ column: "created_at" }, { column: "id" }]);
}

/**
 * The live member of this account with this email, made when there is none.
 * Undefined when the email belongs to a live member of another account:
 * an email signs in to one account only.
 */
export async function ensureMember(db: Knex | Knex.Transaction, accountId: string, email: string, role?: Role): Promise<DbMemberRow | undefined> {
  const normalized = normalizeEmail(email);
  const existing = await findMemberByEmail(db, normalized);
  if (existing) return existing.account_id === accountId ? existing : undefined;
  const [row] = await db<DbMemberRow>("members").insert({ account_id: accountId, email: normalized, ...(role ? { role } : {}) }).returning("*");
  return row;
}

/** Sets a member's password (its stored form). */
export async function setPasswordHash(db: Knex | Knex.Transaction, memberId: string, passwordHash: string): Promise<void> {
  await db("members").where({ id: memberId }).update({ password_hash: passwordHash });
}

/** Marks a member (of `accountId`, when given) removed; the rest of a removal is member-removal.ts's. */
export async function markMemberRemoved(db: Knex | Knex.Transaction, memberId: string, now: Date, accountId?: string): Promise<DbMemberRow | undefined> {
  if (!isUuid(memberId)) return undefined;
  const query = db<DbMemberRow>("members").where({ id: memberId }).whereNull("removed_at");
  if (accountId !== undefined) query.where({ account_id: accountId });
  const [row] = await query.update({ removed_at: now }).returning("*");
  return row;
}
