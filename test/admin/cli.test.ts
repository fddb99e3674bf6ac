import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashApiKey } from "../../src/keys/api-keys.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { postJson, startTestApp, type TestApp } from "../support/app.js";
import { runAdmin, runToExit, startServiceProcess } from "../support/process.js";

let database: TestDatabase;
let service: TestApp;
const decision = {
  model: "typesafe/service-1.13",
  state: "a state",
  questions: { q1: { type: "noul", instructions: "Yes?" } },
};

beforeAll(async () => {
  database = await createTestDatabase();
  service = await startTestApp(database);
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

describe("operator CLI against the service's database", () => {
  it("creates an account whose printed key the gateway accepts, then revokes it", async () => {
    const env = { DATABASE_URL: database.url };
    const created = await runAdmin(["accounts", "create", "--name", "acme", "--credits", "1.5", "--free-requests", "2"], env);
    expect(created.code).toBe(0);
    const account = JSON.parse(created.stdout);
    expect(account).toMatchObject({ name: "acme", balance_credits: 1.5, held_credits: 0, free_requests_remaining: 2 });
    expect(account.api_key).toMatch(/^ts_live_[0-9A-Za-z]{49}$/);

    const accepted = await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey: account.api_key });
    expect(accepted.status).toBe(503);
    expect(accepted.body.data["reason"]).toBe("NOT_CONFIGURED");

    const stored = await database.db("api_keys").where({ account_id: account.account_id });
    expect(stored).toHaveLength(1);
    expect(Buffer.compare(stored[0].key_hash, hashApiKey(account.api_key))).toBe(0);
    expect(JSON.stringify(stored)).not.toContain(account.api_key.slice(8));

    const second = JSON.parse((await runAdmin(["keys", "create", "--account", account.account_id], env)).stdout);
    expect(second.api_key).not.toBe(account.api_key);

    const revoked = await runAdmin(["keys", "revoke", "--key", account.key_id], env);
    expect(JSON.parse(revoked.stdout)).toMatchObject({ revoked: true });
    const refused = await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey: account.api_key });
    expect(refused.status).toBe(401);
    const stillValid = await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey: second.api_key });
    expect(stillValid.status).toBe(503);

    const granted = await runAdmin(["credits", "grant", "--account", account.account_id, "--credits", "0.000001"], env);
    expect(JSON.parse(granted.stdout)).toMatchObject({ balance_credits: 1.500001 });
    const ledger = await database.db("ledger").where({ account_id: account.account_id }).orderBy("id");
    expect(ledger.map((row) => [row.kind, Number(row.amount), row.free_units])).toEqual([
      ["grant", 1_500_000, 0],
      ["free_grant", 0, 2],
      ["grant", 1, 0],
    ]);
  });

  it.each([
    [["accounts", "show", "--account", "00000000-0000-0000-0000-000000000000"], /no account/],
    [["credits", "grant", "--account", "00000000-0000-0000-0000-000000000000", "--credits", "1.2345678"], /credit amount/],
    [["keys", "revoke"], /--key is required/],
    [["frobnicate"], /unknown command/],
    [["credits", "grant", "--account", "00000000-0000-0000-0000-000000000000", "--credits", "-1"], /'--credits' argument is ambiguous/],
    [["credits", "grant", "--account", "00000000-0000-0000-0000-000000000000", "--credits=-1"], /--credits: "-1" is not a credit amount/],
    [["credits", "grant", "--account", "00000000-0000-0000-0000-000000000000", "--credits", "99999999999999"], /--credits: .* is too large/],
    [["accounts", "create", "--credits", "1", "--bogus"], /Unknown option '--bogus'/],
    [["accounts", "create", "--name"], /'--name <value>' argument missing/],
    [["keys", "list", "--help=yes"], /'-h, --help' does not take an argument/],
    [["accounts", "create", "--free-requests", "99999999999"], /--free-requests must be a whole number from 0 to 2147483647/],
  ])("%j fails with a clear message and exit code 2", async (args, message) => {
    const result = await runAdmin(args, { DATABASE_URL: database.url });
    expect(result.code).toBe(2);
    expect(result.stdout).toBe("");
    expect(result.stderr).toMatch(message);
  });

  it.each([
    [["keys", "revoke"], /^admin: --key is required\n$/],
    [["credits", "grant", "--account", "00000000-0000-0000-0000-000000000000"], /^admin: --credits is required\n$/],
    [["webhooks", "rotate", "--account", "00000000-0000-0000-0000-000000000000"], /^admin: --endpoint is required\n$/],
    [["evals", "results"], /^admin: --evaluation is required\n$/],
    [["frobnicate"], /^admin: unknown command "frobnicate"/],
    [["evals", "frobnicate"], /^admin: unknown command "evals frobnicate": see --help\n$/],
  ])("%j is refused before the store is opened: no database is reached", async (args, message) => {
    // Nothing listens on port 1: a command that tried to connect would fail with exit code 1.
    const result = await runAdmin(args, { DATABASE_URL: "postgres://postgres@127.0.0.1:1/none" });
    expect([result.code, result.stdout]).toEqual([2, ""]);
    expect(result.stderr).toMatch(message);
  });
});

describe("embedded store", () => {
  it("the CLI reaches a running service's embedded store, and the service accepts the new key", async () => {
    const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-cli-"));
    const running = await startServiceProcess({ TYPESAFE_DATA_DIR: dataDir });
    try {
      const created = await runAdmin(["accounts", "create", "--credits", "1"], { TYPESAFE_DATA_DIR: dataDir });
      expect(created.stderr).toBe("");
      const { api_key: apiKey } = JSON.parse(created.stdout);
      const response = await postJson(`${running.url}/api/v1/search`, { q: "hello" }, { apiKey });
      expect(response.body.data["reason"]).not.toBe("UNAUTHENTICATED");
      expect(running.logs.join("\n")).not.toContain(apiKey);
    } finally {
      expect(await running.stop()).toBe(0);
      await fs.rm(dataDir, { recursive: true, force: true });
    }
  }, 60_000);

  it("a second service on the same folder is refused naming the owner, and the owner keeps its files and its data", async () => {
    const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-owner-"));
    const owner = await startServiceProcess({ TYPESAFE_DATA_DIR: dataDir });
    try {
      const published = await fs.readFile(path.join(dataDir, "socket.json"), "utf8");
      const second = await runToExit("dist/bundle/main.mjs", [], { TYPESAFE_DATA_DIR: dataDir, PORT: "0", TYPESAFE_SEARCH_SOURCES: "none", TYPESAFE_LLM_EMBEDDED: "off" });
      expect(second.code).toBe(1);
      expect(second.stderr).toMatch(/in use by process \d+, its database on 127\.0\.0\.1:\d+/);
      expect(await fs.readFile(path.join(dataDir, "socket.json"), "utf8")).toBe(published);
      await fs.access(path.join(dataDir, "postmaster.pid"));

      // A CLI that cannot find the published socket (the owner is still starting) must not open the folder beside it.
      await fs.rename(path.join(dataDir, "socket.json"), path.join(dataDir, "socket.json.aside"));
      const beside = await runAdmin(["accounts", "create", "--credits", "1"], { TYPESAFE_DATA_DIR: dataDir });
      expect(beside.code).not.toBe(0);
      expect(beside.stderr).toMatch(/in use by process \d+/);
      await fs.rename(path.join(dataDir, "socket.json.aside"), path.join(dataDir, "socket.json"));

      const created = await runAdmin(["accounts", "create", "--credits", "1"], { TYPESAFE_DATA_DIR: dataDir });
      const { api_key: apiKey, account_id: accountId } = JSON.parse(created.stdout);
      const response = await postJson(`${owner.url}/api/v1/search`, { q: "hello" }, { apiKey });
      expect(response.body.data["reason"]).not.toBe("UNAUTHENTICATED");
      expect(await owner.stop()).toBe(0);
      // The account outlives the service: the CLI now opens the folder itself.
      const shown = await runAdmin(["accounts", "show", "--account", accountId], { TYPESAFE_DATA_DIR: dataDir });
      expect(shown.code).toBe(0);
      expect(JSON.parse(shown.stdout)).toMatchObject({ account_id: accountId, balance_credits: 1 });
    } finally {
      await owner.stop();
      await fs.rm(dataDir, { recursive: true, force: true });
    }
  }, 90_000);
});
