import { generate } from "otplib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { DbMemberRow } from "../../src/team/members.js";
import {
  claimTotpStep,
  confirmTotpEnrollment,
  consumeSignInChallenge,
  countRecoveryCodes,
  createSignInChallenge,
  disableTotp,
  isTwoFactorRequired,
  newTotpSecret,
  RECOVERY_CODES,
  setTwoFactorRequired,
  startTotpEnrollment,
  useRecoveryCode,
  useTotpCode,
} from "../../src/sign-in/two-factor.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { inviteMember, uniqueEmail } from "../session-door/support.js";

/**
 * Two-factor sign-in's store operations on real PostgreSQL, one member at a
 * time: each spends what it should once, and clears what it should.
 */
let database: TestDatabase;
beforeAll(async () => {
  database = await createTestDatabase(4);
});
afterAll(async () => {
  await database?.close();
});

const now = new Date("2031-03-05T12:00:00.000Z");
const codeAt = (secret: string, at: Date) => generate({ secret, epoch: Math.floor(at.getTime() / 1000) });

async function member(): Promise<{ accountId: string; row: () => Promise<DbMemberRow> }> {
  const { accountId } = await createTestAccount(database.db);
  const { memberId } = await inviteMember(database.db, accountId, uniqueEmail("tfa"), now);
  return { accountId, row: () => database.db<DbMemberRow>("members").where({ id: memberId }).first() as Promise<DbMemberRow> };
}

/** A member enrolled with a fresh secret at `now`; the recovery codes it was given. */
async function enrolled() {
  const m = await member();
  const secret = newTotpSecret();
  await startTotpEnrollment(database.db, (await m.row()).id, secret);
  expect((await m.row()).totp_pending_secret).toBe(secret);
  const pending = await m.row();
  const code = await codeAt(secret, now);
  // Everything the transaction needs is read before it: a read through the pool inside it would wait behind it on a one-connection store.
  const codes = await database.db.transaction((tx) => confirmTotpEnrollment(tx, pending, code, now));
  return { ...m, secret, codes: codes! };
}

describe("TOTP", () => {
  it("a secret is 160 bits in base32", () => {
    expect(newTotpSecret()).toMatch(/^[A-Z2-7]{32}$/);
  });

  it("a time step is claimed once, and never one at or before the last claimed", async () => {
    const { row } = await member();
    const id = (await row()).id;
    expect(await claimTotpStep(database.db, id, 100)).toBe(true);
    expect(await claimTotpStep(database.db, id, 100)).toBe(false);
    expect(await claimTotpStep(database.db, id, 99)).toBe(false);
    expect(await claimTotpStep(database.db, id, 101)).toBe(true);
  });

  it("a member without a secret has no valid code", async () => {
    const { row } = await member();
    expect(await useTotpCode(database.db, await row(), "123456", now)).toBe(false);
  });

  it("a code works once", async () => {
    const { row, secret } = await enrolled();
    const later = new Date(now.getTime() + 60_000);
    const code = await codeAt(secret, later);
    expect(await useTotpCode(database.db, await row(), code, later)).toBe(true);
    expect(await useTotpCode(database.db, await row(), code, later)).toBe(false);
  });
});

describe("recovery codes", () => {
  it("enrollment gives the codes, each usable once; enrolling again voids the earlier set", async () => {
    const { row, secret, codes } = await enrolled();
    const other = await enrolled();
    const id = (await row()).id;
    expect(codes).toHaveLength(RECOVERY_CODES);
    expect(await countRecoveryCodes(database.db, id)).toBe(RECOVERY_CODES);
    expect(await useRecoveryCode(database.db, id, codes[0]!, now)).toBe(true);
    expect(await useRecoveryCode(database.db, id, codes[0]!, now)).toBe(false);
    expect(await countRecoveryCodes(database.db, id)).toBe(RECOVERY_CODES - 1);
    await startTotpEnrollment(database.db, id, secret);
    const later = new Date(now.getTime() + 90_000);
    const pending = await row();
    const code = await codeAt(secret, later);
    const fresh = await database.db.transaction((tx) => confirmTotpEnrollment(tx, pending, code, later));
    expect(fresh).toHaveLength(RECOVERY_CODES);
    expect(await useRecoveryCode(database.db, id, codes[1]!, later)).toBe(false);
    expect(await countRecoveryCodes(database.db, id)).toBe(RECOVERY_CODES);
    // Another member's enrollment and codes are untouched.
    expect(await countRecoveryCodes(database.db, (await other.row()).id)).toBe(RECOVERY_CODES);
    expect(await other.row()).toMatchObject({ totp_secret: other.secret, totp_pending_secret: null });
  });

  it("turning TOTP off forgets the secret and voids every code", async () => {
    const { row, codes } = await enrolled();
    const other = await enrolled();
    const id = (await row()).id;
    await database.db.transaction((tx) => disableTotp(tx, id, now));
    expect(await other.row()).toMatchObject({ totp_secret: other.secret });
    expect(await countRecoveryCodes(database.db, (await other.row()).id)).toBe(RECOVERY_CODES);
    expect(await row()).toMatchObject({ totp_secret: null, totp_pending_secret: null, totp_enabled_at: null, totp_last_step: null });
    expect(await countRecoveryCodes(database.db, id)).toBe(0);
    expect(await useRecoveryCode(database.db, id, codes[2]!, now)).toBe(false);
  });
});

describe("the second step's challenge", () => {
  it("is consumed once", async () => {
    const { row } = await member();
    const token = await createSignInChallenge(database.db, (await row()).id, now);
    expect(await consumeSignInChallenge(database.db, token, now)).toBe(true);
    expect(await consumeSignInChallenge(database.db, token, now)).toBe(false);
  });
});

describe("an account's two-factor rule", () => {
  it("is off until an owner sets it, and can be set off again", async () => {
    const { accountId } = await member();
    const other = await member();
    expect(await isTwoFactorRequired(database.db, accountId)).toBe(false);
    await setTwoFactorRequired(database.db, accountId, true);
    expect(await isTwoFactorRequired(database.db, accountId)).toBe(true);
    expect(await isTwoFactorRequired(database.db, other.accountId)).toBe(false);
    await setTwoFactorRequired(database.db, accountId, false);
    expect(await isTwoFactorRequired(database.db, accountId)).toBe(false);
  });
});
