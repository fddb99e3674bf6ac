import { Code } from "@connectrpc/connect";
import { generate } from "otplib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Role } from "../../src/team/roles.js";
import { acceptedTotpStep, RECOVERY_CODES } from "../../src/sign-in/two-factor.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { accountClient, inviteMember, refusal, startAccountApp, uniqueEmail, type AccountClient, type AccountTestApp } from "./support.js";

/**
 * Two-factor sign-in: TOTP per RFC 6238 (otplib, checked here against the
 * RFC's own test vectors), a code accepted once, one-time recovery codes, the
 * second step throttled like the first, and an account that requires it.
 */
let database: TestDatabase;
let service: AccountTestApp;
const PASSWORD = "a long enough password";
const MINUTE = 60_000;

beforeAll(async () => {
  database = await createTestDatabase();
  service = await startAccountApp(database);
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

describe("TOTP codes", () => {
  // RFC 6238 appendix B: the seeds are the ASCII digits, 20, 32 and 64 bytes long for SHA-1, SHA-256 and SHA-512.
  const seed = (bytes: number) => new TextEncoder().encode("1234567890".repeat(7).slice(0, bytes));
  it.each([
    [59, "sha1", "94287082"],
    [1111111109, "sha1", "07081804"],
    [1111111111, "sha1", "14050471"],
    [1234567890, "sha1", "89005924"],
    [2000000000, "sha1", "69279037"],
    [20000000000, "sha1", "65353130"],
    [59, "sha256", "46119246"],
    [1111111109, "sha256", "68084774"],
    [59, "sha512", "90693936"],
    [1111111109, "sha512", "25091201"],
  ] as const)("RFC 6238 test vector: T = %i s, %s, gives %s", async (epoch, algorithm, code) => {
    const bytes = { sha1: 20, sha256: 32, sha512: 64 }[algorithm];
    expect(await generate({ secret: seed(bytes), epoch, algorithm, digits: 8 })).toBe(code);
  });

  // The same RFC key in base32, as an authenticator app holds it; 6 digits are the last 6 of the RFC's 8.
  const RFC_KEY = "GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ";
  it("the service's check accepts the RFC's codes at their time, with their step, and no other", async () => {
    expect(await acceptedTotpStep(RFC_KEY, "287082", new Date(59_000), null)).toBe(1);
    expect(await acceptedTotpStep(RFC_KEY, "081804", new Date(1111111109_000), null)).toBe(37037036);
    expect(await acceptedTotpStep(RFC_KEY, "081805", new Date(1111111109_000), null)).toBeUndefined();
    expect(await acceptedTotpStep(RFC_KEY, "94287082", new Date(59_000), null)).toBeUndefined();
  });

  it("accepts one step of drift either way, not two, and never a step at or before the last one used", async () => {
    const at = new Date(1111111109_000);
    const code = "081804"; // step 37037036
    expect(await acceptedTotpStep(RFC_KEY, code, new Date(at.getTime() + 30_000), null)).toBe(37037036);
    expect(await acceptedTotpStep(RFC_KEY, code, new Date(at.getTime() - 30_000), null)).toBe(37037036);
    expect(await acceptedTotpStep(RFC_KEY, code, new Date(at.getTime() + 61_000), null)).toBeUndefined();
    expect(await acceptedTotpStep(RFC_KEY, code, at, 37037036)).toBeUndefined();
    expect(await acceptedTotpStep(RFC_KEY, code, at, 37037035)).toBe(37037036);
  });
});

/** The code an authenticator app shows for this secret at the service's clock, `stepsAhead` steps later. */
function codeAt(secret: string, stepsAhead = 0): Promise<string> {
  return generate({ secret, epoch: Math.floor(service.clock.now().getTime() / 1000) + 30 * stepsAhead });
}

/** A member of a fresh account (or of the one given), signed in, with two-factor sign-in on. */
async function enrolledMember(init: { accountId?: string; role?: Role } = {}) {
  const accountId = init.accountId ?? (await createTestAccount(database.db)).accountId;
  const email = uniqueEmail("totp");
  const { token, memberId } = await inviteMember(database.db, accountId, email, service.clock.now(), init.role ?? "owner");
  const { client } = accountClient(service.url);
  await client.acceptInvite({ inviteToken: token, password: PASSWORD });
  const started = await client.startTwoFactorEnrollment({});
  const { recoveryCodes } = await client.confirmTwoFactorEnrollment({ code: await codeAt(started.secret) });
  // The code just used at enrollment is spent: the test's sign-ins start a step later.
  service.clock.advance(30_000);
  return { accountId, email, memberId, client, secret: started.secret, recoveryCodes };
}

/** The first step, in a fresh browser: the password, which gives the second step's token and no session. */
async function passwordStep(email: string): Promise<{ client: AccountClient; token: string; setCookies: string[] }> {
  const { client, jar } = accountClient(service.url);
  const answer = await client.signIn({ email, password: PASSWORD });
  expect(answer.member).toBeUndefined();
  expect(answer.secondStepToken).toMatch(/^[A-Za-z0-9_-]{43}$/);
  return { client, token: answer.secondStepToken, setCookies: [...jar.received] };
}

describe("enrollment", () => {
  it("gives a secret and its otpauth URI, needs a first code to turn on, and shows the recovery codes once", async () => {
    const { accountId } = await createTestAccount(database.db);
    const email = uniqueEmail("enroll");
    const { token } = await inviteMember(database.db, accountId, email, service.clock.now());
    const { client } = accountClient(service.url);
    await client.acceptInvite({ inviteToken: token, password: PASSWORD });
    const started = await client.startTwoFactorEnrollment({});
    expect(started.secret).toMatch(/^[A-Z2-7]{32}$/);
    const uri = new URL(started.otpauthUri);
    expect([uri.protocol, uri.host, decodeURIComponent(uri.pathname)]).toEqual(["otpauth:", "totp", `/typesafe:${email.toLowerCase()}`]);
    expect([uri.searchParams.get("secret"), uri.searchParams.get("issuer")]).toEqual([started.secret, "typesafe"]);

    const wrong = await refusal(client.confirmTwoFactorEnrollment({ code: (Number(await codeAt(started.secret)) ^ 1).toString().padStart(6, "0") }));
    expect([wrong.code, wrong.reason, wrong.field]).toEqual([Code.InvalidArgument, "INVALID_ARGUMENT", "code"]);
    expect((await client.getAccount({})).member?.twoFactorEnabled).toBe(false);

    const { recoveryCodes } = await client.confirmTwoFactorEnrollment({ code: await codeAt(started.secret) });
    expect(recoveryCodes).toHaveLength(RECOVERY_CODES);
    expect(new Set(recoveryCodes).size).toBe(RECOVERY_CODES);
    for (const code of recoveryCodes) expect(code).toMatch(/^[a-z2-7]{5}-[a-z2-7]{5}$/);
    expect((await client.getAccount({})).member?.twoFactorEnabled).toBe(true);
    // Stored as hashes only.
    const stored = await database.db("member_recovery_codes").join("members", "members.id", "member_recovery_codes.member_id").where("members.email", email.toLowerCase()).pluck("code_hash");
    expect(stored).toHaveLength(RECOVERY_CODES);
    expect(stored.map((h: Buffer) => h.toString("hex")).join()).not.toContain(Buffer.from(recoveryCodes[0]!).toString("hex"));
    const kinds = (await client.listActivity({ pageSize: 1 })).events.map((e) => e.kind);
    expect(kinds).toEqual(["two_factor_enabled"]);
  });

  it("ends the member's other sessions, opened with the password alone; the one that turned it on stays, and so do other members'", async () => {
    const { accountId } = await createTestAccount(database.db);
    const email = uniqueEmail("others");
    const { token } = await inviteMember(database.db, accountId, email, service.clock.now());
    const { client } = accountClient(service.url);
    await client.acceptInvite({ inviteToken: token, password: PASSWORD });
    const laptop = accountClient(service.url).client;
    const phone = accountClient(service.url).client;
    await laptop.signIn({ email, password: PASSWORD });
    await phone.signIn({ email, password: PASSWORD });
    const colleagueEmail = uniqueEmail("colleague");
    const colleague = accountClient(service.url).client;
    await colleague.acceptInvite({ inviteToken: (await inviteMember(database.db, accountId, colleagueEmail, service.clock.now())).token, password: PASSWORD });

    const started = await client.startTwoFactorEnrollment({});
    await client.confirmTwoFactorEnrollment({ code: await codeAt(started.secret) });
    service.clock.advance(30_000);

    for (const other of [laptop, phone]) expect((await refusal(other.getAccount({}))).reason).toBe("SIGNED_OUT");
    expect((await client.getAccount({})).member?.twoFactorEnabled).toBe(true);
    expect((await colleague.getAccount({})).member?.email).toBe(colleagueEmail.toLowerCase());
    const [enabled] = (await client.listActivity({ pageSize: 1 })).events;
    expect([enabled?.kind, enabled?.detail]).toEqual(["two_factor_enabled", "2 other sessions ended"]);
  });
});

describe("signing in with a second factor", () => {
  it("the password alone gives no session; the right code does, once", async () => {
    const member = await enrolledMember();
    const first = await passwordStep(member.email);
    expect(first.setCookies).toEqual([]);
    expect((await refusal(first.client.getAccount({}))).reason).toBe("SIGNED_OUT");

    const code = await codeAt(member.secret);
    const signedIn = await first.client.signInSecondStep({ secondStepToken: first.token, code });
    expect(signedIn.member?.email).toBe(member.email.toLowerCase());
    expect((await first.client.getAccount({})).member?.id).toBe(member.memberId);

    // The same code again, in another sign-in within its step: refused.
    const second = await passwordStep(member.email);
    const replayed = await refusal(second.client.signInSecondStep({ secondStepToken: second.token, code }));
    expect([replayed.code, replayed.reason]).toEqual([Code.Unauthenticated, "SECOND_STEP_FAILED"]);
    // A token works once: after its sign-in, it is spent.
    expect((await refusal(first.client.signInSecondStep({ secondStepToken: first.token, code: await codeAt(member.secret, 1) }))).reason).toBe("SECOND_STEP_FAILED");
    // The next step's code works.
    service.clock.advance(30_000);
    await second.client.signInSecondStep({ secondStepToken: second.token, code: await codeAt(member.secret) });
    const kinds = (await second.client.listActivity({ pageSize: 3 })).events.map((e) => [e.kind, e.detail]);
    expect(kinds).toEqual([
      ["signed_in", "with an authenticator code"],
      ["sign_in_failed", "second step"],
      ["signed_in", "with an authenticator code"],
    ]);
  });

  it("refuses a wrong code and one of another member's secret", async () => {
    const member = await enrolledMember();
    const other = await enrolledMember();
    const { client, token } = await passwordStep(member.email);
    expect((await refusal(client.signInSecondStep({ secondStepToken: token, code: await codeAt(other.secret) }))).reason).toBe("SECOND_STEP_FAILED");
    expect((await refusal(client.signInSecondStep({ secondStepToken: token, code: "12345" }))).reason).toBe("SECOND_STEP_FAILED");
    expect((await refusal(client.getAccount({}))).reason).toBe("SIGNED_OUT");
  });

  it("a second step that comes after 5 minutes is refused", async () => {
    const member = await enrolledMember();
    const { client, token } = await passwordStep(member.email);
    service.clock.advance(5 * MINUTE + 1);
    expect((await refusal(client.signInSecondStep({ secondStepToken: token, code: await codeAt(member.secret) }))).reason).toBe("SECOND_STEP_FAILED");
  });

  it("a recovery code signs in once, typed with or without its dash and in any case", async () => {
    const member = await enrolledMember();
    const [code] = member.recoveryCodes;
    const first = await passwordStep(member.email);
    await first.client.signInSecondStep({ secondStepToken: first.token, recoveryCode: code!.toUpperCase().replace("-", " ") });
    expect((await first.client.getAccount({})).member?.id).toBe(member.memberId);
    const again = await passwordStep(member.email);
    expect((await refusal(again.client.signInSecondStep({ secondStepToken: again.token, recoveryCode: code! }))).reason).toBe("SECOND_STEP_FAILED");
    await again.client.signInSecondStep({ secondStepToken: again.token, recoveryCode: member.recoveryCodes[1]! });
  });

  it("asks for exactly one of a code and a recovery code, naming the field", async () => {
    const member = await enrolledMember();
    const { client, token } = await passwordStep(member.email);
    expect((await refusal(client.signInSecondStep({ secondStepToken: token }))).field).toBe("code");
    expect((await refusal(client.signInSecondStep({ secondStepToken: token, code: "123456", recoveryCode: "abcde-fghij" }))).field).toBe("code");
    expect((await refusal(client.signInSecondStep({ code: "123456" }))).field).toBe("second_step_token");
  });

  it("is throttled like the first step: 5 wrong codes, then even the right one is 429 with Retry-After, which a new password step does not reset", async () => {
    const member = await enrolledMember();
    for (let i = 0; i < 5; i++) {
      const { client, token } = await passwordStep(member.email);
      expect((await refusal(client.signInSecondStep({ secondStepToken: token, code: "000000" }))).reason).toBe("SECOND_STEP_FAILED");
      if (i === 0) service.clock.advance(MINUTE);
    }
    const { client, token } = await passwordStep(member.email);
    const throttled = await refusal(client.signInSecondStep({ secondStepToken: token, code: await codeAt(member.secret) }));
    expect([throttled.code, throttled.reason]).toEqual([Code.ResourceExhausted, "SIGN_IN_THROTTLED"]);
    expect(Number(throttled.metadata.get("retry-after"))).toBe(14 * 60);
    // A recovery code is no way around it.
    expect((await refusal(client.signInSecondStep({ secondStepToken: token, recoveryCode: member.recoveryCodes[0]! }))).reason).toBe("SIGN_IN_THROTTLED");
    // Once the first failure leaves the window, the right code passes (with a fresh token: the old one has expired).
    service.clock.advance(14 * MINUTE);
    const later = await passwordStep(member.email);
    await later.client.signInSecondStep({ secondStepToken: later.token, code: await codeAt(member.secret) });
    expect((await later.client.getAccount({})).member?.id).toBe(member.memberId);
  });
});

describe("turning it off", () => {
  it("needs a current code, then signing in takes the password alone", async () => {
    const member = await enrolledMember();
    expect((await refusal(member.client.disableTwoFactor({ code: "000000" }))).reason).toBe("SECOND_STEP_FAILED");
    await member.client.disableTwoFactor({ code: await codeAt(member.secret) });
    const { client } = accountClient(service.url);
    expect((await client.signIn({ email: member.email, password: PASSWORD })).member?.id).toBe(member.memberId);
    expect((await client.getAccount({})).member?.twoFactorEnabled).toBe(false);
  });
});

describe("an account that requires two-factor sign-in", () => {
  it("an owner requires it once their own is on; a member without one may only enroll, then works as before", async () => {
    const { accountId } = await createTestAccount(database.db);
    const email = uniqueEmail("owner");
    const { token } = await inviteMember(database.db, accountId, email, service.clock.now(), "owner");
    const owner = accountClient(service.url).client;
    await owner.acceptInvite({ inviteToken: token, password: PASSWORD });
    const unenrolled = await refusal(owner.setTwoFactorRequired({ required: true }));
    expect([unenrolled.code, unenrolled.reason]).toEqual([Code.PermissionDenied, "TWO_FACTOR_REQUIRED"]);

    const started = await owner.startTwoFactorEnrollment({});
    await owner.confirmTwoFactorEnrollment({ code: await codeAt(started.secret) });
    // The session the owner has was started before; the door reads the rule on every call.
    await owner.setTwoFactorRequired({ required: true });

    const memberEmail = uniqueEmail("member");
    const invited = await inviteMember(database.db, accountId, memberEmail, service.clock.now(), "member");
    const member = accountClient(service.url).client;
    await member.acceptInvite({ inviteToken: invited.token, password: PASSWORD });
    expect((await member.getAccount({})).account?.twoFactorRequired).toBe(true);
    const rule = "the account requires two-factor sign-in: enroll a second factor first";
    for (const call of [() => member.listKeys({}), () => member.createKey({}), () => member.listUsage({}), () => member.listMembers({})]) {
      const refused = await refusal(call());
      expect([refused.code, refused.reason, refused.rule, refused.message]).toEqual([Code.PermissionDenied, "TWO_FACTOR_REQUIRED", rule, rule]);
    }
    const csv = await fetch(`${service.url}/account/v1/usage.csv`, { headers: { cookie: "" } });
    expect(csv.status).toBe(401);

    const own = await member.startTwoFactorEnrollment({});
    await member.confirmTwoFactorEnrollment({ code: await codeAt(own.secret) });
    await member.createKey({ name: "now allowed" });
    // While the account requires it, nobody turns theirs off.
    service.clock.advance(30_000);
    expect((await refusal(member.disableTwoFactor({ code: await codeAt(own.secret) }))).reason).toBe("TWO_FACTOR_REQUIRED");
    const kinds = (await owner.listActivity({ pageSize: 10 })).events.filter((e) => e.kind.startsWith("two_factor")).map((e) => [e.kind, e.actor, e.detail]);
    expect(kinds).toEqual([
      ["two_factor_enabled", memberEmail.toLowerCase(), ""],
      ["two_factor_required_changed", email.toLowerCase(), "required"],
      ["two_factor_enabled", email.toLowerCase(), ""],
    ]);
  });
});
