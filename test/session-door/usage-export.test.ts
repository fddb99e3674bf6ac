import http from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createApiKey } from "../../src/keys/store.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { accountClient, inviteMember, startAccountApp, uniqueEmail, type AccountTestApp } from "./support.js";

/**
 * The usage CSV of a busy account: every row of the period, not the newest
 * hundred thousand; filtered by key, endpoint and period; and an export the
 * client abandons stops.
 */
let database: TestDatabase;
let service: AccountTestApp;
const ROWS = 120_000;
let member: { accountId: string; keyId: string; otherKeyId: string; cookie: string };

beforeAll(async () => {
  database = await createTestDatabase();
  service = await startAccountApp(database);
  const account = await createTestAccount(database.db, { units: 1_000_000 });
  const other = await createApiKey(database.db, account.accountId, { name: "other" });
  // Finished calls one second apart from 2030-01-01, alternating keys and endpoints (one INSERT: a few seconds).
  await database.db.raw(
    `INSERT INTO requests (account_id, endpoint, funding, reserved, charged, status, created_at, lease_expires_at, resolved_at, key_id)
     SELECT :account, CASE WHEN i % 2 = 0 THEN 'decide' ELSE 'search' END, 'paid', 1000, 250, 'settled',
            t, t + interval '1 minute', t + interval '10 milliseconds', CASE WHEN i % 3 = 0 THEN :other::uuid ELSE :key::uuid END
       FROM generate_series(1, :rows) AS i, LATERAL (SELECT timestamptz '2030-01-01T00:00:00Z' + i * interval '1 second' AS t) AS times`,
    { account: account.accountId, key: account.keyId, other: other.keyId, rows: ROWS },
  );
  // The test server runs without autovacuum: without statistics the planner sorts every remaining row per page.
  await database.db.raw("ANALYZE requests");
  const { token } = await inviteMember(database.db, account.accountId, uniqueEmail("export"), service.clock.now());
  const { client, jar } = accountClient(service.url);
  await client.acceptInvite({ inviteToken: token, password: "a long enough password" });
  member = { accountId: account.accountId, keyId: account.keyId, otherKeyId: other.keyId, cookie: `typesafe_session=${jar.cookies.get("typesafe_session")}` };
}, 120_000);
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

/** Reads the CSV and counts its data lines without keeping them. */
async function countRows(query: string): Promise<{ status: number; rows: number; first: string; last: string }> {
  const response = await fetch(`${service.url}/account/v1/usage.csv?${query}`, { headers: { cookie: member.cookie } });
  const text = await response.text();
  const lines = text.split("\r\n").slice(1, -1);
  return { status: response.status, rows: lines.length, first: lines[0] ?? "", last: lines.at(-1) ?? "" };
}

describe("the usage CSV streams every row", () => {
  it(`holds all ${ROWS} calls of the period, newest first, and ends with a complete line`, async () => {
    const all = await countRows("");
    expect(all.status).toBe(200);
    expect(all.rows).toBe(ROWS);
    expect(all.first).toMatch(new RegExp(`,${new Date(Date.UTC(2030, 0, 1) + ROWS * 1000).toISOString()},`));
    expect(all.last).toMatch(/,2030-01-01T00:00:01\.000Z,2030-01-01T00:00:01\.010Z$/);
  }, 120_000);

  it("filters by key, endpoint and period like ListUsage", async () => {
    expect((await countRows(`key_id=${member.otherKeyId}`)).rows).toBe(ROWS / 3);
    expect((await countRows(`key_id=${member.keyId}&endpoint=decide`)).rows).toBe(ROWS / 2 - ROWS / 6);
    expect((await countRows("since=2030-01-01T00:00:01Z&until=2030-01-01T00:01:01Z")).rows).toBe(60);
    const bad = await fetch(`${service.url}/account/v1/usage.csv?key_id=nope`, { headers: { cookie: member.cookie } });
    expect([bad.status, ((await bad.json()) as { data: { field: string } }).data.field]).toEqual([400, "key_id"]);
  }, 120_000);

  it("a client that reads slowly holds the export back, and one that leaves ends it", async () => {
    const logged = () => service.logLines.filter((line) => line.includes('"/account/v1/usage.csv"')).length;
    const before = logged();
    const received = await new Promise<number>((resolve, reject) => {
      const req = http.get(`${service.url}/account/v1/usage.csv`, { headers: { cookie: member.cookie } }, (res) => {
        let bytes = 0;
        // Paused after the first chunk: the server must stop at its write buffer, not read on.
        res.once("data", (chunk: Buffer) => {
          bytes += chunk.length;
          res.pause();
          // The server's write buffer and the socket's fill up; then the client leaves.
          setImmediate(() => {
            req.destroy();
            resolve(bytes);
          });
        });
      });
      req.on("error", (err) => ((err as NodeJS.ErrnoException).code === "ECONNRESET" ? undefined : reject(err)));
    });
    expect(received).toBeGreaterThan(0);
    // The export's log line is written when the handler ends: it ends though the file was not finished.
    await expect.poll(logged, { timeout: 30_000, interval: 50 }).toBe(before + 1);
    const line = service.logLines.filter((l) => l.includes('"/account/v1/usage.csv"')).at(-1)!;
    expect(line).toMatch(/CANCELLED|cancelled/);
  }, 120_000);
});
