import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashApiKey } from "../../src/keys/api-keys.js";
import { admit } from "../../src/metering/ledger.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { runAdmin } from "../support/process.js";

/** The operator sets, changes and rolls a key's limits from the CLI, checked by the same rules as the account area. */
let database: TestDatabase;
const env = () => ({ DATABASE_URL: database.url });

beforeAll(async () => {
  database = await createTestDatabase(2);
});
afterAll(async () => {
  await database?.close();
});

const admitWith = (apiKey: string, endpoint: "decide" | "search") =>
  admit(database.db, { keyHash: hashApiKey(apiKey), endpoint, reserveUnits: 1_000, freeAllowed: false, leaseMs: 60_000 });

describe("keys with limits from the CLI", () => {
  it("create with limits, list them with the budget spent, update them in full, roll with a grace", async () => {
    const { accountId } = await createTestAccount(database.db, { units: 1_000_000 });
    const expiresAt = new Date(Date.now() + 86_400_000).toISOString();
    const created = await runAdmin(
      ["keys", "create", "--account", accountId, "--name", "ci", "--expires-at", expiresAt, "--scopes", "search", "--budget", "0.5", "--budget-period", "week", "--rate", "20"],
      env(),
    );
    expect(created.stderr).toBe("");
    const key = JSON.parse(created.stdout);
    expect(key).toMatchObject({
      name: "ci",
      expires_at: expiresAt,
      scopes: ["search"],
      budget_credits: 0.5,
      budget_period: "week",
      requests_per_minute: 20,
      budget_spent_credits: 0,
      budget_held_credits: 0,
    });
    expect((await admitWith(key.api_key, "decide")).outcome).toBe("key_scope_denied");
    expect((await admitWith(key.api_key, "search")).outcome).toBe("admitted");
    const listed = JSON.parse((await runAdmin(["keys", "list", "--account", accountId], env())).stdout);
    expect(listed.keys.find((k: { key_id: string }) => k.key_id === key.key_id)).toMatchObject({ budget_held_credits: 0.001, scopes: ["search"] });

    const updated = JSON.parse((await runAdmin(["keys", "update", "--key", key.key_id, "--rate", "5"], env())).stdout);
    expect(updated).toMatchObject({ expires_at: null, scopes: ["decisions", "search"], budget_credits: null, requests_per_minute: 5 });

    const rolled = JSON.parse((await runAdmin(["keys", "roll", "--key", key.key_id, "--grace-seconds", "0"], env())).stdout);
    expect(rolled).toMatchObject({ requests_per_minute: 5, old_key: { key_id: key.key_id } });
    expect((await admitWith(key.api_key, "search")).outcome).toBe("key_expired");
    expect((await admitWith(rolled.api_key, "search")).outcome).toBe("admitted");
    // The operator's change and roll are in the account's activity, as the operator's.
    const activity = await database.db("account_activity").where({ account_id: accountId }).orderBy("id").select("kind", "actor", "detail");
    expect(activity.map((a) => [a.kind, a.actor])).toEqual([
      ["key_created", "operator"],
      ["key_limits_changed", "operator"],
      ["key_rolled", "operator"],
    ]);
    expect(activity[1]!.detail).toContain(`scopes search → decisions, search; budget 0.5 credits a week → none; rate limit 20 a minute → 5 a minute`);
  });

  it.each([
    [["--rate", "61"], "--rate"],
    [["--budget", "1"], "--budget-period"],
    [["--budget", "-1", "--budget-period", "day"], "--budget"],
    [["--scopes", "admin"], "--scopes"],
    [["--expires-at", "2000-01-01T00:00:00Z"], "--expires-at"],
    [["--expires-at", "tomorrow"], "--expires-at"],
  ])("%j is a usage error naming %s", async (args, option) => {
    const { accountId } = await createTestAccount(database.db);
    const refused = await runAdmin(["keys", "create", "--account", accountId, ...args], env());
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain(option);
  });

  it("a roll's grace above 7 days and a key that does not exist are usage errors", async () => {
    const { keyId } = await createTestAccount(database.db);
    expect((await runAdmin(["keys", "roll", "--key", keyId, "--grace-seconds", "604801"], env())).stderr).toContain("--grace-seconds");
    expect((await runAdmin(["keys", "update", "--key", "nope"], env())).code).toBe(2);
  });
});
