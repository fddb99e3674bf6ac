import { afterAll, beforeAll, expect, it } from "vitest";
import { migrate } from "../../src/db/database.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";

/**
 * The migration that gives members a role, applied to members of the
 * release before it: each account's oldest live member who accepted becomes
 * its owner (the oldest at all when none accepted), every other member keeps
 * what they could do as a member, and a row inserted without a role (as the
 * previous release's CLI does during the upgrade) gets the least power.
 */
let store: TestDatabase;
const MIGRATION = "20261127110000_add_member_roles_and_two_factor";
beforeAll(async () => {
  store = await createTestDatabase(2, { changesSchema: true });
});
afterAll(async () => {
  await store?.close();
});

it("the oldest member of each account who accepted becomes its owner, the others members", async () => {
  const { db } = store;
  // Back to the schema of the release before: the migration's additions undone, its record forgotten.
  await db.raw(`
    DROP TABLE member_recovery_codes, sign_in_challenges, account_settings;
    ALTER TABLE members DROP COLUMN role, DROP COLUMN totp_secret, DROP COLUMN totp_pending_secret, DROP COLUMN totp_enabled_at, DROP COLUMN totp_last_step;
  `);
  await db("schema_migrations").where({ name: MIGRATION }).delete();

  const [one, two] = await db("accounts").insert([{ name: "one" }, { name: "two" }]).returning("id");
  const at = (minute: number) => new Date(Date.UTC(2026, 10, 1, 0, minute));
  const members = await db("members")
    .insert([
      { account_id: one.id, email: "pending-first@one.example", created_at: at(0) },
      { account_id: one.id, email: "accepted@one.example", password_hash: "x", created_at: at(1) },
      { account_id: one.id, email: "later@one.example", password_hash: "x", created_at: at(2) },
      { account_id: one.id, email: "removed@one.example", password_hash: "x", created_at: at(-1), removed_at: at(3) },
      { account_id: two.id, email: "pending@two.example", created_at: at(0) },
      { account_id: two.id, email: "pending-later@two.example", created_at: at(1) },
    ])
    .returning(["email"]);
  expect(members).toHaveLength(6);

  await migrate(db, { useAdvisoryLock: store.isExternal });

  const roles = Object.fromEntries((await db("members").whereIn("account_id", [one.id, two.id]).select("email", "role")).map((m) => [m.email, m.role]));
  expect(roles).toEqual({
    "pending-first@one.example": "member",
    "accepted@one.example": "owner",
    "later@one.example": "member",
    "removed@one.example": "member",
    "pending@two.example": "owner",
    "pending-later@two.example": "member",
  });
  const [added] = await db("members").insert({ account_id: one.id, email: "old-cli@one.example" }).returning("role");
  expect(added.role).toBe("member");
  await expect(db("members").where({ email: "old-cli@one.example" }).update({ role: "king" })).rejects.toThrow(/check constraint/);
  // The activity log takes the new kinds.
  await db("account_activity").insert({ account_id: one.id, kind: "member_role_changed", actor: "operator" });
});
