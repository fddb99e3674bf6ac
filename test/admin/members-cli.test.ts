import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { runAdmin } from "../support/process.js";
import { accountClient, inviteMember, refusal, startAccountApp, uniqueEmail, type AccountTestApp } from "../session-door/support.js";

/** The operator's side of the account area: members invite, list and remove, and what they leave in the activity log. */
let database: TestDatabase;
let service: AccountTestApp;
const env = () => ({ DATABASE_URL: database.url, TYPESAFE_PUBLIC_URL: "https://api.example.com" });

beforeAll(async () => {
  database = await createTestDatabase();
  service = await startAccountApp(database);
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

describe("members from the CLI", () => {
  it("the invite link is the service's TYPESAFE_PUBLIC_URL; without it, the command says which address it assumed", async () => {
    const { accountId } = await createTestAccount(database.db, { units: 1 });
    // PORT set on this command as an operator may have set it on the service only: the link can only follow what it is given.
    const guessed = await runAdmin(["members", "invite", "--account", accountId, "--email", uniqueEmail("guess")], { DATABASE_URL: database.url, PORT: "9123" });
    expect(guessed.code).toBe(0);
    expect(JSON.parse(guessed.stdout).invite_url).toMatch(/^http:\/\/127\.0\.0\.1:9123\/account\/\?invite=/);
    expect(guessed.stderr).toMatch(/assumes the service is at http:\/\/127\.0\.0\.1:9123 .*TYPESAFE_PUBLIC_URL/);
  });

  it("invite prints one JSON object whose link works once; list shows the member; remove ends their session at once", async () => {
    const { accountId } = await createTestAccount(database.db, { units: 1_000_000 });
    const email = uniqueEmail("Ops");
    const invited = await runAdmin(["members", "invite", "--account", accountId, "--email", email.toUpperCase()], env());
    expect(invited.stderr).toBe("");
    expect(invited.code).toBe(0);
    const printed = JSON.parse(invited.stdout);
    expect(Object.keys(printed).sort()).toEqual(["account_id", "email", "expires_at", "invite_token", "invite_url", "member_id", "role"]);
    expect(printed.role).toBe("owner");
    expect(printed.email).toBe(email.toLowerCase());
    expect(printed.invite_url).toBe(`https://api.example.com/account/?invite=${printed.invite_token}`);
    const ttlMs = new Date(printed.expires_at).getTime() - Date.now();
    expect(ttlMs).toBeGreaterThan(24 * 3_600_000 - 60_000);
    expect(ttlMs).toBeLessThanOrEqual(24 * 3_600_000);

    const { client } = accountClient(service.url);
    await client.acceptInvite({ inviteToken: printed.invite_token, password: "twelve chars!" });
    expect((await client.getAccount({})).account?.id).toBe(accountId);

    const listed = JSON.parse((await runAdmin(["members", "list", "--account", accountId], env())).stdout);
    expect(listed.members).toEqual([expect.objectContaining({ member_id: printed.member_id, email: email.toLowerCase(), invite_accepted: true })]);

    // The account's only owner stays until another owner is there.
    const refused = await runAdmin(["members", "remove", "--member", printed.member_id], env());
    expect([refused.code, refused.stdout]).toEqual([2, ""]);
    expect(refused.stderr).toMatch(/the last owner cannot be removed or demoted/);
    const second = JSON.parse((await runAdmin(["members", "invite", "--account", accountId, "--email", uniqueEmail("next"), "--role", "owner"], env())).stdout);
    expect(second.role).toBe("owner");

    const removed = await runAdmin(["members", "remove", "--member", printed.member_id], env());
    expect(JSON.parse(removed.stdout)).toMatchObject({ removed: true, member_id: printed.member_id, sessions_ended: 1 });
    expect((await refusal(client.getAccount({}))).reason).toBe("SIGNED_OUT");
    expect(JSON.parse((await runAdmin(["members", "list", "--account", accountId], env())).stdout).members).toEqual([
      expect.objectContaining({ member_id: second.member_id, role: "owner", invite_accepted: false }),
    ]);

    const kinds = await database.db("account_activity").where({ account_id: accountId }).orderBy("id").pluck("kind");
    expect(kinds).toEqual(["member_invited", "invite_accepted", "member_invited", "member_removed"]);
  }, 120_000);

  it("keys create, keys revoke and credits grant are logged as the operator's; accounts show reads the account area's view", async () => {
    const { accountId } = await createTestAccount(database.db, { units: 0, freeRequests: 3 });
    const key = JSON.parse((await runAdmin(["keys", "create", "--account", accountId, "--name", "batch"], env())).stdout);
    expect(key).toMatchObject({ name: "batch" });
    await runAdmin(["keys", "revoke", "--key", key.key_id], env());
    await runAdmin(["keys", "revoke", "--key", key.key_id], env());
    await runAdmin(["credits", "grant", "--account", accountId, "--credits", "2.5"], env());
    const events = await database.db("account_activity").where({ account_id: accountId }).orderBy("id").select("kind", "actor", "detail");
    expect(events).toEqual([
      { kind: "key_created", actor: "operator", detail: expect.stringMatching(/^ts_live_\w{6}…\w{4}$/) },
      { kind: "key_revoked", actor: "operator", detail: expect.stringMatching(/^ts_live_\w{6}…\w{4}$/) },
      { kind: "credits_granted", actor: "operator", detail: "2.5 credits" },
    ]);
    const shown = JSON.parse((await runAdmin(["accounts", "show", "--account", accountId], env())).stdout);
    expect(shown).toMatchObject({ balance_credits: 2.5, free_requests_remaining: 3, max_in_flight: 5, requests_per_minute: 60 });
  });

  it("remove revokes the keys the member created and lists them; --keep-keys keeps them working, marked as kept by the operator", async () => {
    const { accountId, apiKey: operatorKey } = await createTestAccount(database.db, { units: 1_000_000 });
    // Invited through the store functions the CLI's invite runs: this test is about remove.
    const keyOf = async (email: string) => {
      const invited = await inviteMember(database.db, accountId, email, new Date());
      const { client } = accountClient(service.url);
      await client.acceptInvite({ inviteToken: invited.token, password: "a long enough password" });
      const created = await client.createKey({ name: `${email.slice(0, 6)} key` });
      return { memberId: invited.memberId, keyId: created.key!.id, secret: created.secret, client };
    };
    // An owner, who cannot be removed while the last: that one stays.
    await inviteMember(database.db, accountId, uniqueEmail("owner"), new Date(), "owner");
    const leaving = await keyOf(uniqueEmail("leaving"));
    const secondOfLeaving = await leaving.client.createKey({});
    await leaving.client.revokeKey({ keyId: secondOfLeaving.key!.id });
    const staying = await keyOf(uniqueEmail("staying"));
    const kept = await keyOf(uniqueEmail("kept"));
    // A revoked key answers 401 before anything else; a live one gets past the key check.
    const apiStatus = async (key: string) =>
      (await fetch(`${service.url}/api/v1/sources`, { headers: { authorization: `Bearer ${key}` } })).status;
    expect(await apiStatus(leaving.secret)).not.toBe(401);

    const removed = JSON.parse((await runAdmin(["members", "remove", "--member", leaving.memberId], env())).stdout);
    expect(removed).toMatchObject({ removed: true, member_id: leaving.memberId, keys_kept: [] });
    // The key it had revoked itself is not listed again.
    expect(removed.keys_revoked).toEqual([{ key_id: leaving.keyId, name: expect.stringMatching(/ key$/), prefix: expect.stringMatching(/^ts_live_/), last4: leaving.secret.slice(-4) }]);
    expect(await apiStatus(leaving.secret)).toBe(401);
    expect(await apiStatus(staying.secret)).not.toBe(401);
    expect(await apiStatus(operatorKey)).not.toBe(401);

    const keptAnswer = JSON.parse((await runAdmin(["members", "remove", "--member", kept.memberId, "--keep-keys"], env())).stdout);
    expect(keptAnswer).toMatchObject({ keys_revoked: [], keys_kept: [{ key_id: kept.keyId }] });
    expect(await apiStatus(kept.secret)).not.toBe(401);
    const { keys } = await staying.client.listKeys({});
    const keptKey = keys.find((k) => k.id === kept.keyId)!;
    expect([keptKey.keptBy, keptKey.keptAt !== undefined, keptKey.revokedAt]).toEqual(["operator", true, undefined]);
    const stayingKey = keys.find((k) => k.id === staying.keyId)!;
    expect([stayingKey.keptBy, stayingKey.keptAt, stayingKey.revokedAt]).toEqual(["", undefined, undefined]);
    expect(keys.find((k) => k.id === leaving.keyId)?.revokedAt).toBeDefined();

    const events = await database.db("account_activity").where({ account_id: accountId }).where("kind", "in", ["member_removed", "key_revoked"]).orderBy("id").select("kind", "actor");
    expect(events).toEqual([
      { kind: "key_revoked", actor: expect.stringMatching(/^leaving-/) },
      { kind: "member_removed", actor: "operator" },
      { kind: "key_revoked", actor: "operator" },
      { kind: "member_removed", actor: "operator" },
    ]);
  });

  it.each([
    [["members", "invite", "--account", "00000000-0000-0000-0000-000000000000", "--email", "a@b.c"], /no account/],
    [["members", "invite", "--email", "a@b.c"], /--account is required/],
    [["members", "remove", "--member", "not-a-uuid"], /no member with id/],
    [["members", "remove", "--member", "00000000-0000-0000-0000-000000000000"], /no member with id/],
  ])("%j fails with a clear message and exit code 2", async (args, message) => {
    const result = await runAdmin(args, env());
    expect(result.code).toBe(2);
    expect(result.stdout).toBe("");
    expect(result.stderr).toMatch(message);
  });

  it("refuses an email that is not one, and one that is a member of another account", async () => {
    const first = await createTestAccount(database.db);
    const second = await createTestAccount(database.db);
    const email = uniqueEmail("taken");
    await inviteMember(database.db, first.accountId, email, new Date());
    const taken = await runAdmin(["members", "invite", "--account", second.accountId, "--email", email], env());
    expect(taken.code).toBe(2);
    expect(taken.stderr).toMatch(/already a member of another account/);
    const bad = await runAdmin(["members", "invite", "--account", first.accountId, "--email", "no at sign"], env());
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--email must be an email address/);
  });
});
