import { Code } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashApiKey } from "../../src/keys/api-keys.js";
import { hashToken } from "../../src/sign-in/secret-tokens.js";
import { admit, finish } from "../../src/metering/ledger.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { accountClient, inviteMember, refusal, startAccountApp, uniqueEmail, type AccountTestApp } from "./support.js";

/**
 * Who may do what in the account area: sessions only by cookie (never an API
 * key), pages of other sites refused, one account's ids answered as missing
 * in another's, invites once and within a day, sessions ended by idleness,
 * age, sign-out and removal, and sign-in guessing throttled.
 */
let database: TestDatabase;
let service: AccountTestApp;
const PASSWORD = "a long enough password";

beforeAll(async () => {
  database = await createTestDatabase();
  // Every client here is one address (loopback): the per-client bound on password work is raised so
  // that the throttle per email, not the queue, answers the bursts below (the queue has its own tests).
  service = await startAccountApp(database, { TYPESAFE_PASSWORD_CHECKS_PER_CLIENT: "64", TYPESAFE_PASSWORD_CHECKS_QUEUED: "64" });
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

/** A fresh account with one member who has accepted their invite, and a signed-in client. */
async function signedInMember(init: { units?: number } = {}) {
  const account = await createTestAccount(database.db, { units: init.units ?? 1_000_000 });
  const email = uniqueEmail("member");
  const { token, memberId } = await inviteMember(database.db, account.accountId, email, service.clock.now());
  const { client, jar } = accountClient(service.url);
  await client.acceptInvite({ inviteToken: token, password: PASSWORD });
  return { ...account, email, memberId, client, jar };
}

const MINUTE = 60_000;

describe("an API key is never a session", () => {
  it("a call with only a valid API key is SIGNED_OUT (UNAUTHENTICATED, 401), on every account RPC that needs a session", async () => {
    const { apiKey } = await signedInMember();
    const { client } = accountClient(service.url, { headers: { authorization: `Bearer ${apiKey}` } });
    for (const call of [
      client.getAccount({}),
      client.listKeys({}),
      client.createKey({}),
      client.revokeKey({ keyId: "x" }),
      client.listUsage({}),
      client.getUsageSummary({}),
      client.listActivity({}),
    ]) {
      const refused = await refusal(call);
      expect(refused).toMatchObject({ code: Code.Unauthenticated, reason: "SIGNED_OUT", message: "not signed in, or the session ended: sign in to the account area" });
    }
    const response = await fetch(`${service.url}/typesafe.account.v1.AccountService/GetAccount`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
      body: "{}",
    });
    expect(response.status).toBe(401);
    expect(await response.json()).toMatchObject({ code: "unauthenticated" });
  });

  it("the key's own hash as a cookie is no session either", async () => {
    const { apiKey } = await signedInMember();
    const { client } = accountClient(service.url, { headers: { cookie: `typesafe_session=${hashApiKey(apiKey).toString("base64url")}` } });
    expect((await refusal(client.getAccount({}))).reason).toBe("SIGNED_OUT");
  });
});

describe("pages of other sites", () => {
  it.each([
    ["Origin of another site", { origin: "https://evil.example" }],
    ["Origin null", { origin: "null" }],
    ["Origin on another port", { origin: "http://127.0.0.1:1" }],
    ["Sec-Fetch-Site cross-site", { "sec-fetch-site": "cross-site" }],
    ["Sec-Fetch-Site same-site", { "sec-fetch-site": "same-site" }],
  ])("%s: refused with CROSS_SITE_REFUSED (403), nothing done", async (_, headers) => {
    const member = await signedInMember();
    const { client } = accountClient(service.url, { headers, jar: member.jar });
    for (const call of [client.signIn({ email: member.email, password: PASSWORD }), client.createKey({ name: "x" }), client.getAccount({})]) {
      expect(await refusal(call)).toMatchObject({
        code: Code.PermissionDenied,
        reason: "CROSS_SITE_REFUSED",
        message: "origin: calls to the account area must come from its own pages",
        field: "origin",
        rule: "the service's own origin",
      });
    }
    expect((await member.client.listKeys({})).keys).toHaveLength(1);
    const response = await fetch(`${service.url}/typesafe.account.v1.AccountService/SignOut`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: "{}",
    });
    expect(response.status).toBe(403);
  });

  it("the service's own origin passes, and no answer carries a CORS header, preflight included", async () => {
    const member = await signedInMember();
    const { client } = accountClient(service.url, { headers: { origin: service.url, "sec-fetch-site": "same-origin" }, jar: member.jar });
    expect((await client.getAccount({})).account?.id).toBe(member.accountId);
    for (const method of ["OPTIONS", "POST"]) {
      const response = await fetch(`${service.url}/typesafe.account.v1.AccountService/GetAccount`, {
        method,
        headers: {
          origin: "https://evil.example",
          "access-control-request-method": "POST",
          "content-type": "application/json",
          cookie: `typesafe_session=${member.jar.cookies.get("typesafe_session")}`,
        },
        ...(method === "POST" ? { body: "{}" } : {}),
      });
      expect([...response.headers.keys()].filter((name) => name.startsWith("access-control-"))).toEqual([]);
      expect(response.status).not.toBe(200);
    }
  });
});

describe("one account's ids in another's session", () => {
  it("revoking another account's key is NOT_FOUND exactly as a missing or malformed id, and the key keeps working", async () => {
    const alice = await signedInMember();
    const bob = await signedInMember();
    const answers = [];
    for (const keyId of [bob.keyId, "00000000-0000-4000-8000-000000000000", "not-a-uuid", ""]) {
      const refused = await refusal(alice.client.revokeKey({ keyId }));
      answers.push({ code: refused.code, reason: refused.reason, message: refused.message });
    }
    expect(answers).toEqual(Array(4).fill({ code: Code.NotFound, reason: "NOT_FOUND", message: "key_id: no such key" }));
    const bobKeys = await database.db("api_keys").where({ id: bob.keyId }).first("revoked_at");
    expect(bobKeys.revoked_at).toBeNull();
    expect((await alice.client.listKeys({})).keys.map((k) => k.id)).toEqual([alice.keyId]);
  });

  it("keys are listed newest first; revoking twice keeps the first time and logs once", async () => {
    const member = await signedInMember();
    service.clock.advance(1_000);
    const newer = await member.client.createKey({ name: "newer" });
    expect((await member.client.listKeys({})).keys.map((k) => k.id)).toEqual([newer.key!.id, member.keyId]);
    const first = await member.client.revokeKey({ keyId: newer.key!.id });
    service.clock.advance(5_000);
    const second = await member.client.revokeKey({ keyId: newer.key!.id });
    expect(second.key?.revokedAt).toEqual(first.key?.revokedAt);
    expect(Number(first.key!.revokedAt!.seconds) * 1000).toBe(Math.floor(service.clock.now().getTime() / 1000) * 1000 - 5_000);
    const kinds = (await member.client.listActivity({})).events.map((e) => e.kind);
    expect(kinds.filter((k) => k === "key_revoked")).toHaveLength(1);
  });

  it("usage and its page tokens never reach another account's calls", async () => {
    const alice = await signedInMember({ units: 10_000_000 });
    const bob = await signedInMember({ units: 10_000_000 });
    const call = async (apiKey: string) => {
      const admission = await admit(database.db, { keyHash: hashApiKey(apiKey), endpoint: "decide", reserveUnits: 1_000, freeAllowed: false, leaseMs: 60_000 });
      if (admission.outcome !== "admitted") throw new Error(admission.outcome);
      await finish(database.db, { requestId: admission.requestId, success: true, actualUnits: 10 });
      return admission.requestId;
    };
    const aliceCalls = [await call(alice.apiKey), await call(alice.apiKey)];
    const bobCall = await call(bob.apiKey);
    const all = await alice.client.listUsage({});
    expect(all.records.map((r) => r.requestId)).toEqual([...aliceCalls].reverse());
    expect(all.records.every((r) => r.keyId === alice.keyId)).toBe(true);
    // A token naming a position (bob's call, far in the future) still lists alice's calls only.
    const forged = Buffer.from(JSON.stringify(["2999-01-01T00:00:00.000Z", bobCall])).toString("base64url");
    const page = await alice.client.listUsage({ pageToken: forged });
    expect(page.records.map((r) => r.requestId)).toEqual([...aliceCalls].reverse());
    const summary = await alice.client.getUsageSummary({ until: { seconds: BigInt(Math.floor(Date.now() / 1000) + 3600) } });
    expect(summary.buckets.reduce((n, b) => n + b.calls, 0)).toBe(2);
    expect((await alice.client.listActivity({})).events.every((e) => e.actor === alice.email)).toBe(true);
  });
});

describe("invites", () => {
  it("work once: a second acceptance, even at the same moment, is INVITE_INVALID", async () => {
    const { accountId } = await createTestAccount(database.db);
    const { token } = await inviteMember(database.db, accountId, uniqueEmail("twice"), service.clock.now());
    const results = await Promise.allSettled([0, 1, 2].map(() => accountClient(service.url).client.acceptInvite({ inviteToken: token, password: PASSWORD })));
    expect(results.filter((r) => r.status === "fulfilled")).toHaveLength(1);
    expect((await refusal(accountClient(service.url).client.acceptInvite({ inviteToken: token, password: PASSWORD }))).reason).toBe("INVITE_INVALID");
  });

  it("expire after 24 hours", async () => {
    const { accountId } = await createTestAccount(database.db);
    const { token } = await inviteMember(database.db, accountId, uniqueEmail("late"), new Date(service.clock.now().getTime() - 24 * 3_600_000));
    const refused = await refusal(accountClient(service.url).client.acceptInvite({ inviteToken: token, password: PASSWORD }));
    expect(refused).toMatchObject({ code: Code.FailedPrecondition, reason: "INVITE_INVALID" });
    const { token: fresh } = await inviteMember(database.db, accountId, uniqueEmail("in-time"), new Date(service.clock.now().getTime() - 24 * 3_600_000 + 1_000));
    await accountClient(service.url).client.acceptInvite({ inviteToken: fresh, password: PASSWORD });
  });

  it("a new invite of the same member replaces the old link; a short password is refused without using the invite", async () => {
    const { accountId } = await createTestAccount(database.db);
    const email = uniqueEmail("again");
    const first = await inviteMember(database.db, accountId, email, service.clock.now());
    const second = await inviteMember(database.db, accountId, email, service.clock.now());
    expect(second.memberId).toBe(first.memberId);
    const { client } = accountClient(service.url);
    expect((await refusal(client.acceptInvite({ inviteToken: first.token, password: PASSWORD }))).reason).toBe("INVITE_INVALID");
    const short = await refusal(client.acceptInvite({ inviteToken: second.token, password: "eleven char" }));
    expect(short).toMatchObject({ code: Code.InvalidArgument, reason: "INVALID_ARGUMENT", message: "password: at least 12 characters" });
    await client.acceptInvite({ inviteToken: second.token, password: "twelve chars" });
    expect((await client.getAccount({})).member?.email).toBe(email);
  });

  it("tokens are stored hashed: the database holds neither the invite nor the session token", async () => {
    const { accountId } = await createTestAccount(database.db);
    const { token, memberId } = await inviteMember(database.db, accountId, uniqueEmail("hashed"), service.clock.now());
    const { client, jar } = accountClient(service.url);
    await client.acceptInvite({ inviteToken: token, password: PASSWORD });
    const session = jar.cookies.get("typesafe_session")!;
    const invites = await database.db("member_invites").where({ member_id: memberId });
    const sessions = await database.db("member_sessions").where({ member_id: memberId });
    expect(invites.map((r) => Buffer.compare(r.token_hash, hashToken(token)))).toEqual([0]);
    expect(sessions.map((r) => Buffer.compare(r.token_hash, hashToken(session)))).toEqual([0]);
    const dump = JSON.stringify(await database.db("members").where({ id: memberId })) + JSON.stringify(invites) + JSON.stringify(sessions);
    expect(dump).not.toContain(token);
    expect(dump).not.toContain(session);
    expect(dump).not.toContain(PASSWORD);
  });
});

describe("sessions end", () => {
  it("after 30 minutes unused, but not while used more often", async () => {
    const { client } = await signedInMember();
    service.clock.advance(29 * MINUTE);
    await client.getAccount({});
    service.clock.advance(29 * MINUTE);
    await client.getAccount({});
    service.clock.advance(30 * MINUTE);
    expect(await refusal(client.getAccount({}))).toMatchObject({ code: Code.Unauthenticated, reason: "SIGNED_OUT" });
  });

  it("12 hours after sign-in however busy", async () => {
    const { client } = await signedInMember();
    for (let elapsed = 0; elapsed < 12 * 60 - 20; elapsed += 20) {
      service.clock.advance(20 * MINUTE);
      await client.listKeys({});
    }
    service.clock.advance(20 * MINUTE);
    expect((await refusal(client.listKeys({}))).reason).toBe("SIGNED_OUT");
  });

  it("at sign-out: the old cookie replayed is refused", async () => {
    const { client, jar } = await signedInMember();
    const token = jar.cookies.get("typesafe_session")!;
    await client.signOut({});
    expect(jar.received.at(-1)).toBe("typesafe_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    const { accountId } = await database.db("member_sessions as s").join("members as m", "m.id", "s.member_id").where("s.token_hash", hashToken(token)).first("m.account_id as accountId");
    const kinds = await database.db("account_activity").where({ account_id: accountId }).orderBy("id").pluck("kind");
    expect(kinds).toEqual(["invite_accepted", "signed_out"]);
    // Signing out again, or without a session, is fine and logs nothing more.
    await client.signOut({});
    const { client: replayOut } = accountClient(service.url, { headers: { cookie: `typesafe_session=${token}` } });
    await replayOut.signOut({});
    expect((await database.db("account_activity").where({ account_id: accountId }).pluck("kind")).length).toBe(2);
    const { client: replay } = accountClient(service.url, { headers: { cookie: `typesafe_session=${token}` } });
    expect((await refusal(replay.getAccount({}))).reason).toBe("SIGNED_OUT");
  });

  it("when the member is removed, at once; a removed member can neither sign in nor use an old invite", async () => {
    const member = await signedInMember();
    const { token } = await inviteMember(database.db, member.accountId, uniqueEmail("second"), service.clock.now());
    await database.db.transaction(async (tx) => {
      const { markMemberRemoved } = await import("../../src/team/members.js");
      const { endMemberSessions } = await import("../../src/sign-in/sessions.js");
      await markMemberRemoved(tx, member.memberId, service.clock.now());
      await endMemberSessions(tx, member.memberId, service.clock.now());
    });
    expect((await refusal(member.client.getAccount({}))).reason).toBe("SIGNED_OUT");
    expect((await refusal(accountClient(service.url).client.signIn({ email: member.email, password: PASSWORD }))).reason).toBe("SIGN_IN_FAILED");
    await accountClient(service.url).client.acceptInvite({ inviteToken: token, password: PASSWORD });
  });

  it("when a new invite sets a new password: the old password and every old session stop working", async () => {
    const member = await signedInMember();
    const { token } = await inviteMember(database.db, member.accountId, member.email, service.clock.now());
    const { client } = accountClient(service.url);
    await client.acceptInvite({ inviteToken: token, password: "the new password" });
    expect((await refusal(member.client.getAccount({}))).reason).toBe("SIGNED_OUT");
    expect((await client.getAccount({})).member?.email).toBe(member.email);
    expect((await refusal(accountClient(service.url).client.signIn({ email: member.email, password: PASSWORD }))).reason).toBe("SIGN_IN_FAILED");
  });

  it("a new invite of one member leaves other members' invites working", async () => {
    const { accountId } = await createTestAccount(database.db);
    const first = uniqueEmail("first");
    await inviteMember(database.db, accountId, first, service.clock.now());
    const other = await inviteMember(database.db, accountId, uniqueEmail("other"), service.clock.now());
    await inviteMember(database.db, accountId, first, service.clock.now());
    await accountClient(service.url).client.acceptInvite({ inviteToken: other.token, password: PASSWORD });
  });

  it("a removed member's pending invite no longer works, even if it was never marked used", async () => {
    const { accountId } = await createTestAccount(database.db);
    const { token, memberId } = await inviteMember(database.db, accountId, uniqueEmail("gone"), service.clock.now());
    await database.db("members").where({ id: memberId }).update({ removed_at: service.clock.now() });
    expect((await refusal(accountClient(service.url).client.acceptInvite({ inviteToken: token, password: PASSWORD }))).reason).toBe("INVITE_INVALID");
  });

  it("a session whose member is removed without its sessions being ended is still refused", async () => {
    const member = await signedInMember();
    await database.db("members").where({ id: member.memberId }).update({ removed_at: service.clock.now() });
    expect((await refusal(member.client.getAccount({}))).reason).toBe("SIGNED_OUT");
  });

  it.each([
    ["a malformed token", "typesafe_session=abc"],
    ["a well-formed unknown token", `typesafe_session=${"A".repeat(43)}`],
    ["the cookie twice", "typesafe_session=A; typesafe_session=B"],
    ["an empty cookie", "typesafe_session="],
  ])("%s is no session", async (_, cookie) => {
    const { client } = accountClient(service.url, { headers: { cookie } });
    expect((await refusal(client.getAccount({}))).reason).toBe("SIGNED_OUT");
  });
});

describe("sign-in", () => {
  it("a wrong password and an unknown email get the same answer; the right one starts a new session", async () => {
    const member = await signedInMember();
    const { client, jar } = accountClient(service.url);
    const wrong = await refusal(client.signIn({ email: member.email, password: "not the password" }));
    const unknown = await refusal(client.signIn({ email: uniqueEmail("nobody"), password: "not the password" }));
    expect(wrong).toMatchObject({ code: Code.Unauthenticated, reason: "SIGN_IN_FAILED", message: "wrong email or password" });
    expect({ ...unknown, metadata: undefined }).toEqual({ ...wrong, metadata: undefined });
    const signedIn = await client.signIn({ email: member.email.toUpperCase(), password: PASSWORD });
    expect(signedIn.member?.id).toBe(member.memberId);
    expect(jar.cookies.get("typesafe_session")).not.toBe(member.jar.cookies.get("typesafe_session"));
    const kinds = await database.db("account_activity").where({ account_id: member.accountId }).orderBy("id").pluck("kind");
    expect(kinds).toEqual(["invite_accepted", "sign_in_failed", "signed_in"]);
  });

  it("a member invited but not yet signed up cannot sign in with any password", async () => {
    const { accountId } = await createTestAccount(database.db);
    const email = uniqueEmail("pending");
    await inviteMember(database.db, accountId, email, service.clock.now());
    expect((await refusal(accountClient(service.url).client.signIn({ email, password: PASSWORD }))).reason).toBe("SIGN_IN_FAILED");
  });

  it("after 5 failures within 15 minutes even the right password is SIGN_IN_THROTTLED (429, Retry-After) until the first leaves the window", async () => {
    const member = await signedInMember();
    const { client } = accountClient(service.url);
    for (let i = 0; i < 5; i++) {
      expect((await refusal(client.signIn({ email: member.email, password: `wrong password ${i}` }))).reason).toBe("SIGN_IN_FAILED");
      if (i === 0) service.clock.advance(MINUTE);
    }
    const throttled = await refusal(client.signIn({ email: member.email, password: PASSWORD }));
    expect(throttled).toMatchObject({ code: Code.ResourceExhausted, reason: "SIGN_IN_THROTTLED" });
    expect(throttled.metadata.get("retry-after")).toBe(String(14 * 60));
    const response = await fetch(`${service.url}/typesafe.account.v1.AccountService/SignIn`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ email: member.email, password: PASSWORD }),
    });
    expect(response.status).toBe(429);
    expect(response.headers.get("retry-after")).toBe(String(14 * 60));
    service.clock.advance(14 * MINUTE);
    await client.signIn({ email: member.email, password: PASSWORD });
    // A success forgets the failures.
    await refusal(client.signIn({ email: member.email, password: "wrong again!" }));
    await client.signIn({ email: member.email, password: PASSWORD });
  });

  it("a burst of guesses sent at once gets at most 5 through to the password check", async () => {
    const member = await signedInMember();
    const results = await Promise.all(
      Array.from({ length: 12 }, (_, i) => refusal(accountClient(service.url).client.signIn({ email: member.email, password: `guess number ${i}` }))),
    );
    const reasons = results.map((r) => r.reason).sort();
    expect(reasons.filter((r) => r === "SIGN_IN_FAILED")).toHaveLength(5);
    expect(reasons.filter((r) => r === "SIGN_IN_THROTTLED")).toHaveLength(7);
  });

  it("attempts out of the window are dropped as new ones come, whatever their email", async () => {
    const { client } = accountClient(service.url);
    const stale = uniqueEmail("stale");
    await refusal(client.signIn({ email: stale, password: "whatever it is" }));
    expect(await database.db("sign_in_attempts").where({ email: stale }).pluck("id")).toHaveLength(1);
    service.clock.advance(16 * MINUTE);
    for (let i = 0; i < 3; i++) await refusal(client.signIn({ email: uniqueEmail("fresh"), password: "whatever it is" }));
    expect(await database.db("sign_in_attempts").where({ email: stale }).pluck("id")).toEqual([]);
  });

  it("unknown emails are throttled alike, so the throttle tells nothing about which exist", async () => {
    const email = uniqueEmail("ghost");
    const { client } = accountClient(service.url);
    for (let i = 0; i < 5; i++) await refusal(client.signIn({ email, password: "whatever it is" }));
    // Another email's successful sign-in forgets only its own failures.
    const member = await signedInMember();
    await accountClient(service.url).client.signIn({ email: member.email, password: PASSWORD });
    expect((await refusal(client.signIn({ email, password: "whatever it is" }))).reason).toBe("SIGN_IN_THROTTLED");
  });
});
