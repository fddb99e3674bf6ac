import { Code } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashApiKey } from "../../src/keys/api-keys.js";
import { createApiKey, findLiveKeyByHash, revokeAccountKey } from "../../src/keys/store.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { accountClient, inviteMember, refusal, startAccountApp, uniqueEmail, type AccountTestApp } from "../session-door/support.js";

/** How many keys an account may hold, how they are listed a page at a time, and that revoking one touches that one only. */
let database: TestDatabase;
let service: AccountTestApp;
const PASSWORD = "a long enough password";
const MAX_KEYS = 4;

beforeAll(async () => {
  database = await createTestDatabase();
  service = await startAccountApp(database, { TYPESAFE_MAX_KEYS_PER_ACCOUNT: String(MAX_KEYS) });
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

async function signedInMember() {
  const account = await createTestAccount(database.db, { units: 1_000_000 });
  const { token } = await inviteMember(database.db, account.accountId, uniqueEmail("keys"), service.clock.now());
  const { client, jar } = accountClient(service.url);
  await client.acceptInvite({ inviteToken: token, password: PASSWORD });
  const cookie = [...jar.cookies].map(([n, v]) => `${n}=${v}`).join("; ");
  return { ...account, client, cookie };
}

describe("keys per account are capped", () => {
  it("a burst of creations stops at the cap (KEY_LIMIT_REACHED, 409); revoking one makes room for one", async () => {
    // The account starts with the operator's key: MAX_KEYS - 1 more fit.
    const { client } = await signedInMember();
    const results = await Promise.all(Array.from({ length: 6 }, (_, i) => client.createKey({ name: `k${i}` }).then(() => "created", (err: unknown) => refusal(Promise.reject(err)))));
    expect(results.filter((r) => r === "created")).toHaveLength(MAX_KEYS - 1);
    for (const refused of results.filter((r) => r !== "created")) {
      expect(refused).toMatchObject({ code: Code.FailedPrecondition, reason: "KEY_LIMIT_REACHED" });
    }
    const { keys } = await client.listKeys({});
    expect(keys).toHaveLength(MAX_KEYS);
    await client.revokeKey({ keyId: keys[0]!.id });
    await client.createKey({ name: "after a revoke" });
    expect((await refusal(client.createKey({}))).reason).toBe("KEY_LIMIT_REACHED");
  });

  it("the JSON path answers 409 with the envelope code", async () => {
    const { cookie, client } = await signedInMember();
    for (let i = 1; i < MAX_KEYS; i++) await client.createKey({});
    const response = await fetch(`${service.url}/account/v1/keys`, { method: "POST", headers: { cookie, "content-type": "application/json" }, body: "{}" });
    expect(response.status).toBe(409);
    expect(await response.json()).toMatchObject({ code: 40902, data: { reason: "KEY_LIMIT_REACHED", metadata: { max_keys: String(MAX_KEYS) } } });
  });
});

describe("ListKeys is paged (page_size, page_token)", () => {
  it("walks every key once, newest first, over Connect and over the JSON path's query", async () => {
    const { client, accountId, cookie } = await signedInMember();
    // Revoked keys are listed too, so an account can hold more listed keys than the cap.
    for (let i = 0; i < 7; i++) {
      const { keyId } = await createApiKey(database.db, accountId, { name: `listed ${i}` });
      await revokeAccountKey(database.db, accountId, keyId, new Date());
    }
    const all: string[] = [];
    let pageToken = "";
    do {
      const page = await client.listKeys({ pageSize: 3, pageToken });
      expect(page.keys.length).toBeLessThanOrEqual(3);
      all.push(...page.keys.map((k) => k.id));
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
    expect(all).toHaveLength(8);
    expect(new Set(all).size).toBe(8);
    const everything = await client.listKeys({ pageSize: 500 });
    expect(everything.keys.map((k) => k.id)).toEqual(all);
    expect(everything.nextPageToken).toBe("");

    const viaJson: string[] = [];
    let token = "";
    do {
      const response = await fetch(`${service.url}/account/v1/keys?page_size=5${token ? `&page_token=${token}` : ""}`, { headers: { cookie } });
      const body = (await response.json()) as { data: { keys: { id: string }[]; next_page_token: string } };
      viaJson.push(...body.data.keys.map((k) => k.id));
      token = body.data.next_page_token;
    } while (token !== "");
    expect(viaJson).toEqual(all);
  });

  it.each([
    ["a token this service did not make", { pageToken: "nonsense" }, "page_token"],
    ["a token of another list (activity's bigint id)", { pageToken: Buffer.from(JSON.stringify(["2026-01-01T00:00:00Z", "42"])).toString("base64url") }, "page_token"],
    ["a page size over 500", { pageSize: 501 }, "page_size"],
  ])("%s is a 400 naming %s", async (_, request, field) => {
    const { client } = await signedInMember();
    expect(await refusal(client.listKeys(request))).toMatchObject({ code: Code.InvalidArgument, field: field });
  });

  it("the JSON path refuses a page size given twice or not a number", async () => {
    const { cookie } = await signedInMember();
    for (const query of ["page_size=2&page_size=3", "page_size=two", "pageSize=1&page_size=2"]) {
      const response = await fetch(`${service.url}/account/v1/keys?${query}`, { headers: { cookie } });
      expect(response.status, query).toBe(400);
    }
  });
});

describe("revoking a key touches that key only", () => {
  it("the account's other keys and another account's keys still work", async () => {
    const a = await createTestAccount(database.db);
    const second = await createApiKey(database.db, a.accountId);
    const b = await createTestAccount(database.db);
    const revoked = await revokeAccountKey(database.db, a.accountId, a.keyId, new Date());
    expect(revoked).toMatchObject({ revokedNow: true, key: { id: a.keyId } });
    expect((await findLiveKeyByHash(database.db, hashApiKey(a.apiKey)))?.accountId).toBeUndefined();
    expect((await findLiveKeyByHash(database.db, hashApiKey(second.apiKey)))?.accountId).toBe(a.accountId);
    expect((await findLiveKeyByHash(database.db, hashApiKey(b.apiKey)))?.accountId).toBe(b.accountId);
    // Another account's key id is not this account's to revoke.
    expect(await revokeAccountKey(database.db, a.accountId, b.keyId, new Date())).toBeUndefined();
    expect((await findLiveKeyByHash(database.db, hashApiKey(b.apiKey)))?.accountId).toBe(b.accountId);
  });

  it("a second revoke keeps the first time and says so; malformed ids find nothing rather than failing in SQL", async () => {
    const a = await createTestAccount(database.db);
    const first = await revokeAccountKey(database.db, a.accountId, a.keyId, new Date(Date.UTC(2030, 0, 1)));
    const again = await revokeAccountKey(database.db, a.accountId, a.keyId, new Date(Date.UTC(2031, 0, 1)));
    expect([first?.revokedNow, again?.revokedNow]).toEqual([true, false]);
    expect(again?.key.revoked_at).toEqual(new Date(Date.UTC(2030, 0, 1)));
    expect(await revokeAccountKey(database.db, a.accountId, "not-a-uuid", new Date())).toBeUndefined();
    expect(await revokeAccountKey(database.db, "not-a-uuid", a.keyId, new Date())).toBeUndefined();
  });
});
