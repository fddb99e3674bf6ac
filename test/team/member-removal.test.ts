import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashApiKey } from "../../src/keys/api-keys.js";
import { removeMember } from "../../src/team/member-removal.js";
import { createApiKey, findLiveKeyByHash } from "../../src/keys/store.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { inviteMember, uniqueEmail } from "../session-door/support.js";

/**
 * removeMember in the store: the member's own live keys are revoked (or kept,
 * marked by whom), each in the activity log; nobody else's key is touched,
 * and a member of another account is not found.
 */
let database: TestDatabase;
beforeAll(async () => {
  database = await createTestDatabase(4);
});
afterAll(async () => {
  await database?.close();
});

const now = new Date("2031-03-05T12:00:00.000Z");

async function team() {
  const { accountId, apiKey: operatorKey } = await createTestAccount(database.db);
  const email = uniqueEmail("leaver");
  const { memberId, token } = await inviteMember(database.db, accountId, email, now);
  const stayer = uniqueEmail("stayer");
  await inviteMember(database.db, accountId, stayer, now);
  const named = await createApiKey(database.db, accountId, { name: "ci", createdBy: email });
  const unnamed = await createApiKey(database.db, accountId, { createdBy: email });
  const revokedBefore = await createApiKey(database.db, accountId, { createdBy: email });
  await database.db("api_keys").where({ id: revokedBefore.keyId }).update({ revoked_at: new Date(now.getTime() - 1000) });
  // Five keys in all, made in a random id order: the answer lists them sorted whatever order the update returns.
  const more = [];
  for (let i = 0; i < 3; i++) more.push(await createApiKey(database.db, accountId, { name: `k${i}`, createdBy: email }));
  const stayerKey = await createApiKey(database.db, accountId, { createdBy: stayer });
  const live = async (apiKey: string) => (await findLiveKeyByHash(database.db, hashApiKey(apiKey))) !== undefined;
  const activity = () => database.db("account_activity").where({ account_id: accountId }).orderBy("id").select("kind", "actor", "detail");
  return { accountId, memberId, token, email, stayer, named, unnamed, more, revokedBefore, stayerKey, operatorKey, live, activity };
}

const listed = (key: { keyId: string; row: { name: string; display_prefix: string; last4: string } }) => ({
  id: key.keyId,
  name: key.row.name,
  display_prefix: key.row.display_prefix,
  last4: key.row.last4,
});
const byId = <T extends { id: string }>(keys: T[]) => [...keys].sort((a, b) => (a.id < b.id ? -1 : 1));

describe("removing a member", () => {
  it("revokes the live keys they made, lists them by id and logs each; other members' and the operator's keys work on", async () => {
    const t = await team();
    const removal = await database.db.transaction((tx) => removeMember(tx, { memberId: t.memberId, accountId: t.accountId, actor: "owner@example.com", keepKeys: false, now }));
    expect(removal?.member.removed_at).toEqual(now);
    expect(removal?.keysRevoked).toEqual(byId([t.named, t.unnamed, ...t.more].map(listed)));
    expect(removal?.keysKept).toEqual([]);
    expect(await t.live(t.named.apiKey)).toBe(false);
    expect(await t.live(t.unnamed.apiKey)).toBe(false);
    expect(await t.live(t.stayerKey.apiKey)).toBe(true);
    expect(await t.live(t.operatorKey)).toBe(true);
    expect(await database.db("api_keys").where({ id: t.revokedBefore.keyId }).first("revoked_at")).toEqual({ revoked_at: new Date(now.getTime() - 1000) });
    const details = new Map([
      [t.named.keyId, `${t.named.row.display_prefix}…${t.named.row.last4} (ci)`],
      [t.unnamed.keyId, `${t.unnamed.row.display_prefix}…${t.unnamed.row.last4}`],
      ...t.more.map((k, i) => [k.keyId, `${k.row.display_prefix}…${k.row.last4} (k${i})`] as [string, string]),
    ]);
    expect(await t.activity()).toEqual([
      { kind: "member_removed", actor: "owner@example.com", detail: t.email },
      ...removal!.keysRevoked.map((key) => ({ kind: "key_revoked", actor: "owner@example.com", detail: details.get(key.id) })),
    ]);
    expect(await database.db("member_invites").where({ member_id: t.memberId }).whereNull("used_at")).toEqual([]);
    // The other member's pending invite still works.
    const stayer = await database.db("members").where({ email: t.stayer }).first("id");
    expect(await database.db("member_invites").where({ member_id: stayer.id }).whereNull("used_at")).toHaveLength(1);
  });

  it("with keepKeys, the keys work on, marked kept by the remover, and no revocation is logged", async () => {
    const t = await team();
    const removal = await database.db.transaction((tx) => removeMember(tx, { memberId: t.memberId, accountId: t.accountId, actor: "owner@example.com", keepKeys: true, now }));
    expect(removal?.keysKept).toEqual(byId([t.named, t.unnamed, ...t.more].map(listed)));
    expect(removal?.keysRevoked).toEqual([]);
    expect(await t.live(t.named.apiKey)).toBe(true);
    expect(await database.db("api_keys").where({ id: t.named.keyId }).first("kept_by", "kept_at")).toEqual({ kept_by: "owner@example.com", kept_at: now });
    expect(await database.db("api_keys").where({ id: t.stayerKey.keyId }).first("kept_by")).toEqual({ kept_by: null });
    expect((await t.activity()).map((a) => a.kind)).toEqual(["member_removed"]);
  });

  it("of another account, or by a malformed or unknown id, is not found and changes nothing; the operator passes no account", async () => {
    const t = await team();
    const other = await createTestAccount(database.db);
    const remove = (request: { memberId: string; accountId?: string }) =>
      database.db.transaction((tx) => removeMember(tx, { actor: "operator", keepKeys: false, now, ...request }));
    expect(await remove({ memberId: t.memberId, accountId: other.accountId })).toBeUndefined();
    expect(await remove({ memberId: t.memberId, accountId: "not-a-uuid" })).toBeUndefined();
    expect(await remove({ memberId: "not-a-uuid", accountId: t.accountId })).toBeUndefined();
    expect(await remove({ memberId: "not-a-uuid" })).toBeUndefined();
    expect(await remove({ memberId: crypto.randomUUID(), accountId: t.accountId })).toBeUndefined();
    expect(await t.live(t.named.apiKey)).toBe(true);
    expect(await t.activity()).toEqual([]);
    const removal = await remove({ memberId: t.memberId });
    expect(removal?.keysRevoked).toHaveLength(5);
  });
});
