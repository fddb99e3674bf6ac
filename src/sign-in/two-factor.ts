import crypto from "node:crypto";
import type { Knex } from "knex";
import { generateSecret, generateURI, verify } from "otplib";
import type { DbMemberRow } from "../team/members.js";
import { generateToken, hashToken, isWellFormedToken } from "./secret-tokens.js";

/**
 * Two-factor sign-in with TOTP (RFC 6238): 6 digits, 30-second steps, SHA-1,
 * the parameters every authenticator app reads from an otpauth URI. otplib
 * computes and checks the codes; this module keeps the rules around them:
 * a code is accepted once (its time step is recorded, and a code of that
 * step or an earlier one is refused), one step of clock drift either way
 * (RFC 6238 section 5.2), and one-time recovery codes stored as SHA-256.
 */
export const TOTP_ISSUER = "typesafe";
/** How far a code's step may be from now, in seconds: one 30-second step either way. */
export const TOTP_TOLERANCE_S = 30;
/** Recovery codes given at enrollment; each works once. */
export const RECOVERY_CODES = 10;
/** How long the second step may wait after the password was accepted. */
export const SIGN_IN_CHALLENGE_TTL_MS = 5 * 60_000;

/** A new TOTP secret: 20 random bytes (RFC 4226's recommended 160 bits), base32. */
export function newTotpSecret(): string {
  return generateSecret({ length: 20 });
}

/** The otpauth URI an authenticator app reads (usually from a QR code). */
export function totpUri(secret: string, email: string): string {
  return generateURI({ issuer: TOTP_ISSUER, label: email, secret });
}

/** True for what a member could have typed as a TOTP code: 6 digits. */
export function isTotpCodeShaped(code: string): boolean {
  return /^\d{6}$/.test(code);
}

/**
 * The time step of a valid code at `now` that is later than `afterStep`, or
 * undefined: a wrong code, one outside the drift window, or a replay.
 */
export async function acceptedTotpStep(secret: string, code: string, now: Date, afterStep: number | null): Promise<number | undefined> {
  if (!isTotpCodeShaped(code)) return undefined;
  const result = await verify({
    secret,
    token: code,
    epoch: Math.floor(now.getTime() / 1000),
    epochTolerance: TOTP_TOLERANCE_S,
    ...(afterStep === null ? {} : { afterTimeStep: afterStep }),
  });
  return result.valid && "timeStep" in result ? result.timeStep : undefined;
}

/**
 * Records that a code of this step was used, unless one of this step or a
 * later one already was: of two sign-ins racing with the same code, one wins.
 */
export async function claimTotpStep(db: Knex | Knex.Transaction, memberId: string, step: number): Promise<boolean> {
  const rows = await db("members")
    .where({ id: memberId })
    .where((q) => q.whereNull("totp_last_step").orWhere("totp_last_step", "<", step))
    .update({ totp_last_step: step })
    .returning("id");
  return rows.length === 1;
}

/** Checks a member's TOTP code at `now` and spends it: true once per code. */
export async function useTotpCode(db: Knex | Knex.Transaction, member: DbMemberRow, code: string, now: Date): Promise<boolean> {
  if (member.totp_secret === null) return false;
  const step = await acceptedTotpStep(member.totp_secret, code, now, member.totp_last_step === null ? null : Number(member.totp_last_step));
  return step !== undefined && (await claimTotpStep(db, member.id, step));
}

/** Shows a new secret for the member to enroll; it works only once confirmed with a code. */
export async function startTotpEnrollment(db: Knex | Knex.Transaction, memberId: string, secret: string): Promise<void> {
  await db("members").where({ id: memberId }).update({ totp_pending_secret: secret });
}

/**
 * Confirms enrollment with a first code of the pending secret: the secret
 * becomes the member's, and a fresh set of recovery codes replaces any
 * earlier one. The codes are returned this once; undefined for a wrong code.
 */
export async function confirmTotpEnrollment(tx: Knex.Transaction, member: DbMemberRow, code: string, now: Date): Promise<string[] | undefined> {
  if (member.totp_pending_secret === null) return undefined;
  const step = await acceptedTotpStep(member.totp_pending_secret, code, now, null);
  if (step === undefined) return undefined;
  await tx("members")
    .where({ id: member.id })
    .update({ totp_secret: member.totp_pending_secret, totp_pending_secret: null, totp_enabled_at: now, totp_last_step: step });
  return replaceRecoveryCodes(tx, member.id, now);
}

/** Turns the member's second factor off: the secret and every recovery code are forgotten. */
export async function disableTotp(tx: Knex.Transaction, memberId: string, now: Date): Promise<void> {
  await tx("members").where({ id: memberId }).update({ totp_secret: null, totp_pending_secret: null, totp_enabled_at: null, totp_last_step: null });
  await tx("member_recovery_codes").where({ member_id: memberId }).whereNull("used_at").update({ used_at: now });
}

/** A recovery code as typed: letters in lower case, without spaces or dashes. */
function normalizeRecoveryCode(code: string): string {
  return code.toLowerCase().replace(/[\s-]/g, "");
}

/** Ten characters of base32 (50 bits), shown as two groups of five. */
function newRecoveryCode(): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz234567";
  const bytes = crypto.randomBytes(10);
  const chars = [...bytes].map((b) => alphabet[b & 31]).join("");
  return `${chars.slice(0, 5)}-${chars.slice(5)}`;
}

async function replaceRecoveryCodes(tx: Knex.Transaction, memberId: string, now: Date): Promise<string[]> {
  await tx("member_recovery_codes").where({ member_id: memberId }).whereNull("used_at").update({ used_at: now });
  const codes = Array.from({ length: RECOVERY_CODES }, newRecoveryCode);
  await tx("member_recovery_codes").insert(codes.map((code) => ({ member_id: memberId, code_hash: hashToken(normalizeRecoveryCode(code)) })));
  return codes;
}

/** Spends one of the member's recovery codes: true once per code, in one statement (two racing uses cannot both pass). */
export async function useRecoveryCode(db: Knex | Knex.Transaction, memberId: string, code: string, now: Date): Promise<boolean> {
  const normalized = normalizeRecoveryCode(code);
  if (!/^[a-z2-7]{10}$/.test(normalized)) return false;
  const rows = await db("member_recovery_codes")
    .where({ member_id: memberId, code_hash: hashToken(normalized) })
    .whereNull("used_at")
    .update({ used_at: now })
    .returning("id");
  return rows.length === 1;
}

/** How many unused recovery codes the member has. */
export async function countRecoveryCodes(db: Knex | Knex.Transaction, memberId: string): Promise<number> {
  const row = await db("member_recovery_codes").where({ member_id: memberId }).whereNull("used_at").count<{ count: string }[]>({ count: "*" }).first();
  return Number(row?.count ?? 0);
}

/**
 * A password was accepted and the second step is due: a random token,
 * stored hashed, that the second step presents within its TTL. No session
 * exists until that step passes.
 */
export async function createSignInChallenge(db: Knex | Knex.Transaction, memberId: string, now: Date): Promise<string> {
  const token = generateToken();
  await db("sign_in_challenges").insert({
    token_hash: hashToken(token),
    member_id: memberId,
    created_at: now,
    expires_at: new Date(now.getTime() + SIGN_IN_CHALLENGE_TTL_MS),
  });
  return token;
}

/** The live member of a pending, unexpired challenge, or undefined. */
export async function findSignInChallenge(db: Knex | Knex.Transaction, token: string, now: Date): Promise<DbMemberRow | undefined> {
  if (!isWellFormedToken(token)) return undefined;
  return db<DbMemberRow>("sign_in_challenges as c")
    .join("members as m", "m.id", "c.member_id")
    .select("m.*")
    .where("c.token_hash", hashToken(token))
    .whereNull("c.used_at")
    .where("c.expires_at", ">", now)
    .whereNull("m.removed_at")
    .first();
}

/** Marks a challenge used; false when it already was (a racing second step won). */
export async function consumeSignInChallenge(db: Knex | Knex.Transaction, token: string, now: Date): Promise<boolean> {
  const rows = await db("sign_in_challenges").where({ token_hash: hashToken(token) }).whereNull("used_at").update({ used_at: now }).returning("member_id");
  return rows.length === 1;
}

/** Whether the account requires every member to sign in with a second factor. */
export async function isTwoFactorRequired(db: Knex | Knex.Transaction, accountId: string): Promise<boolean> {
  const row = await db("account_settings").where({ account_id: accountId }).first();
  return row?.require_two_factor === true;
}

/** Sets whether the account requires a second factor. */
export async function setTwoFactorRequired(db: Knex | Knex.Transaction, accountId: string, required: boolean): Promise<void> {
  await db("account_settings").insert({ account_id: accountId, require_two_factor: required }).onConflict("account_id").merge();
}
