import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashApiKey } from "../../src/keys/api-keys.js";
import { countLiveKeysLocked, createApiKey, findAccountKey, findLiveKeyByHash, listAccountKeys, listApiKeys, revokeAccountKey, revokeApiKey } from "../../src/keys/store.js";
import { findAccount, insertAccount } from "../../src/admin/account-funding.js";
import { isUuid } from "../../src/validation.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";

/**
 * The key store's operations on real PostgreSQL: each touches the one key
 * (or the one account) it names and no other, which a query that lost its
 * WHERE clause would break.
 */
let database: TestDatabase;
beforeAll(async () => {
  database = await createTestDatabase(4);
});
afterAll(async () => {
  await database?.close();
});

const T0 = new Date("2031-04-01T10:00:00.000Z");

/** An account with three keys, and a neighbour account with one. */
async function accountWithKeys() {
  const mine = await createTestAccount(database.db);
  const second = await createApiKey(database.db, mine.accountId, { name: "second", createdBy: "a@example.com" });
  const third = await createApiKey(database.db, mine.accountId, { name: "third" });
  const neighbour = await createTestAccount(database.db);
  const live = async (apiKey: string) => (await findLiveKeyByHash(database.db, hashApiKey(apiKey)))?.keyId;
  return { mine, second, third, neighbour, live };
}

describe("revoking a key", () => {
  it("in the account area revokes that key only: the account's other keys and another account's keep working", async () => {
    const { mine, second, third, neighbour, live } = await accountWithKeys();
    const revoked = await revokeAccountKey(database.db, mine.accountId, second.keyId, T0);
    expect(revoked?.revokedNow).toBe(true);
    expect(revoked?.key.id).toBe(second.keyId);
    expect(revoked?.key.revoked_at).toEqual(T0);
    expect(await live(second.apiKey)).toBeUndefined();
    expect(await live(mine.apiKey)).toBe(mine.keyId);
    expect(await live(third.apiKey)).toBe(third.keyId);
    expect(await live(neighbour.apiKey)).toBe(neighbour.keyId);
  });

  it("twice keeps the first time, and says the second revoked nothing", async () => {
    const { mine, second } = await accountWithKeys();
    await revokeAccountKey(database.db, mine.accountId, second.keyId, T0);
    const again = await revokeAccountKey(database.db, mine.accountId, second.keyId, new Date(T0.getTime() + 60_000));
    expect(again?.revokedNow).toBe(false);
    expect(again?.key.revoked_at).toEqual(T0);
  });

  it("of another account, an unknown or a malformed id, revokes nothing and finds nothing", async () => {
    const { mine, neighbour, live } = await accountWithKeys();
    expect(await revokeAccountKey(database.db, mine.accountId, neighbour.keyId, T0)).toBeUndefined();
    expect(await live(neighbour.apiKey)).toBe(neighbour.keyId);
    expect(await revokeAccountKey(database.db, mine.accountId, crypto.randomUUID(), T0)).toBeUndefined();
    expect(await revokeAccountKey(database.db, mine.accountId, "not-a-uuid", T0)).toBeUndefined();
    expect(await revokeAccountKey(database.db, "not-a-uuid", mine.keyId, T0)).toBeUndefined();
    expect(await live(mine.apiKey)).toBe(mine.keyId);
  });

  it("by the operator revokes that key only, keeps the first time when repeated, and is false for an unknown or malformed id", async () => {
    const { mine, second, third, neighbour, live } = await accountWithKeys();
    expect(await revokeApiKey(database.db, second.keyId)).toBe(true);
    expect(await live(second.apiKey)).toBeUndefined();
    expect(await live(mine.apiKey)).toBe(mine.keyId);
    expect(await live(third.apiKey)).toBe(third.keyId);
    expect(await live(neighbour.apiKey)).toBe(neighbour.keyId);
    const first = await database.db("api_keys").where({ id: second.keyId }).first("revoked_at");
    expect(first.revoked_at).toBeInstanceOf(Date);
    // now() is the transaction's start: a second revoke in a later transaction would move it.
    expect(await revokeApiKey(database.db, second.keyId)).toBe(true);
    expect(await database.db("api_keys").where({ id: second.keyId }).first("revoked_at")).toEqual(first);
    expect(await revokeApiKey(database.db, crypto.randomUUID())).toBe(false);
    expect(await revokeApiKey(database.db, "not-a-uuid")).toBe(false);
  });
});

describe("finding keys", () => {
  it("a live key by its hash gives its account, id and expiry; a revoked or unknown one nothing", async () => {
    const { mine, second } = await accountWithKeys();
    const expiresAt = new Date("2032-01-01T00:00:00.000Z");
    await database.db("api_keys").where({ id: mine.keyId }).update({ expires_at: expiresAt });
    expect(await findLiveKeyByHash(database.db, hashApiKey(mine.apiKey))).toEqual({ accountId: mine.accountId, keyId: mine.keyId, expiresAt });
    expect(await findLiveKeyByHash(database.db, hashApiKey(second.apiKey))).toEqual({ accountId: mine.accountId, keyId: second.keyId, expiresAt: null });
    await revokeApiKey(database.db, second.keyId);
    expect(await findLiveKeyByHash(database.db, hashApiKey(second.apiKey))).toBeUndefined();
    expect(await findLiveKeyByHash(database.db, hashApiKey("ts_live_unknown"))).toBeUndefined();
  });

  it("one key of the account, never another account's", async () => {
    const { mine, second, neighbour } = await accountWithKeys();
    expect((await findAccountKey(database.db, mine.accountId, second.keyId))?.name).toBe("second");
    expect(await findAccountKey(database.db, mine.accountId, neighbour.keyId)).toBeUndefined();
    expect(await findAccountKey(database.db, mine.accountId, "nope")).toBeUndefined();
    expect(await findAccountKey(database.db, "nope", second.keyId)).toBeUndefined();
  });

  it("an account by id; a malformed id is undefined, not an SQL error", async () => {
    const { mine } = await accountWithKeys();
    expect((await findAccount(database.db, mine.accountId))?.id).toBe(mine.accountId);
    expect(await findAccount(database.db, "nope")).toBeUndefined();
  });
});

describe("creating an account", () => {
  it("keeps its name and starts empty", async () => {
    const account = await insertAccount(database.db, "acme");
    expect(account).toMatchObject({ name: "acme", balance: expect.anything(), reserved: expect.anything() });
    expect(Number(account.balance)).toBe(0);
    expect((await findAccount(database.db, account.id))?.name).toBe("acme");
  });
});

describe("creating a key", () => {
  it("stores its hash, prefix, last four characters, name and creator; the operator's by default", async () => {
    const { mine, second } = await accountWithKeys();
    const row = await database.db("api_keys").where({ id: second.keyId }).first();
    expect(row).toMatchObject({
      account_id: mine.accountId,
      name: "second",
      created_by: "a@example.com",
      last4: second.apiKey.slice(-4),
      display_prefix: second.apiKey.slice(0, row.display_prefix.length),
      revoked_at: null,
    });
    expect(row.key_hash).toEqual(hashApiKey(second.apiKey));
    expect(second.row).toMatchObject({ id: second.keyId, name: "second", created_by: "a@example.com", expires_at: null });
    expect(await database.db("api_keys").where({ id: mine.keyId }).first("name", "created_by")).toEqual({ name: "", created_by: "operator" });
  });
});

describe("listing keys", () => {
  it("for the operator: the account's keys only, oldest first", async () => {
    const { mine, second, third } = await accountWithKeys();
    const keys = await listApiKeys(database.db, mine.accountId);
    expect(keys.map((k) => k.id)).toEqual([mine.keyId, second.keyId, third.keyId]);
  });

  it("in the account area: newest first, in pages, each after the last one's cursor", async () => {
    const { mine, second, third } = await accountWithKeys();
    // Keys made within one millisecond list by id: a millisecond apart each, their order is their creation's.
    for (const [i, id] of [mine.keyId, second.keyId, third.keyId].entries()) {
      await database.db("api_keys").where({ id }).update({ created_at: new Date(T0.getTime() + i) });
    }
    const first = await listAccountKeys(database.db, mine.accountId, { size: 2 });
    expect(first.keys.map((k) => k.id)).toEqual([third.keyId, second.keyId]);
    expect(first.more).toBe(true);
    const last = first.keys.at(-1)!;
    const rest = await listAccountKeys(database.db, mine.accountId, { size: 2, after: { createdAt: last.created_at, id: last.id } });
    expect(rest.keys.map((k) => k.id)).toEqual([mine.keyId]);
    expect(rest.more).toBe(false);
    const whole = await listAccountKeys(database.db, mine.accountId, { size: 3 });
    expect(whole.keys).toHaveLength(3);
    expect(whole.more).toBe(false);
    expect(await listAccountKeys(database.db, "nope", { size: 2 })).toEqual({ keys: [], more: false });
    expect(await listAccountKeys(database.db, mine.accountId, { size: 2, after: { createdAt: T0, id: "nope" } })).toEqual({ keys: [], more: false });
  });

  it("keys made in one transaction (one created_at) still come newest id first, and page without a gap or a repeat", async () => {
    const { accountId } = await createTestAccount(database.db);
    await database.db("api_keys").where({ account_id: accountId }).update({ revoked_at: T0 });
    const ids = await database.db.transaction(async (tx) => {
      const made = [];
      for (let i = 0; i < 4; i++) made.push((await createApiKey(tx, accountId)).keyId);
      return made;
    });
    const newestFirst = [...ids].sort().reverse();
    const first = await listAccountKeys(database.db, accountId, { size: 2 });
    const last = first.keys.at(-1)!;
    const rest = await listAccountKeys(database.db, accountId, { size: 3, after: { createdAt: last.created_at, id: last.id } });
    expect([...first.keys, ...rest.keys].map((k) => k.id).filter((id) => ids.includes(id))).toEqual(newestFirst);
  });

  it("counts the account's live keys only", async () => {
    const { mine, second } = await accountWithKeys();
    await revokeApiKey(database.db, second.keyId);
    expect(await database.db.transaction((tx) => countLiveKeysLocked(tx, mine.accountId))).toBe(2);
  });
});

describe("isUuid", () => {
  it.each([
    ["0b38c1a2-4d5e-4f60-8a7b-9c0d1e2f3a4b", true],
    ["0B38C1A2-4D5E-4F60-8A7B-9C0D1E2F3A4B", true],
    ["", false],
    ["0b38c1a2-4d5e-4f60-8a7b-9c0d1e2f3a4", false],
    ["x0b38c1a2-4d5e-4f60-8a7b-9c0d1e2f3a4b", false],
    ["0b38c1a2-4d5e-4f60-8a7b-9c0d1e2f3a4bx", false],
    ["0b38c1a2-4d5e-4f60-8a7b-9c0d1e2f3g4b", false],
    ["0b38c1a24d5e4f608a7b9c0d1e2f3a4b", false],
  ])("%j -> %s", (text, expected) => {
    expect(isUuid(text)).toBe(expected);
  });
});
