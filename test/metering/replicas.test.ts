import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestAccount, postJson } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { deferred, startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { holdQuestions } from "../support/held-upstream.js";
import { assertInvariants } from "../support/invariants.js";
import { startServiceProcess, type ServiceProcess } from "../support/process.js";
import { waitFor } from "../support/wait.js";

/**
 * Two service processes on one database: the limits hold across replicas,
 * and a replica killed with SIGKILL while it holds calls gives the account's
 * balance and concurrency back after the lease, while the other keeps serving.
 * Leases are short here (2 s deadline + 1 s margin) so the test does not wait long.
 * On the embedded store, which runs one statement at a time for both replicas
 * and every other test file, admitting 40 calls can take longer than 2 s on a
 * busy machine: the first calls would reach their deadline (502) while the
 * last are admitted, so there the deadline is 10 s.
 */
let database: TestDatabase;
let fake: FakeLlm;
let replicas: ServiceProcess[] = [];

const deadlineMs = () => (database.isExternal ? 2_000 : 10_000);
const replicaEnv = () => ({
  DATABASE_URL: database.url,
  TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
  TYPESAFE_LLM_MAX_RETRIES: "0",
  TYPESAFE_LLM_REQUEST_TIMEOUT_MS: String(deadlineMs()),
  TYPESAFE_LLM_CALL_TIMEOUT_MS: String(deadlineMs()),
  TYPESAFE_LEASE_MARGIN_MS: "1000",
  TYPESAFE_SWEEP_INTERVAL_MS: "200",
  TYPESAFE_LOG_LEVEL: "info",
  // The embedded test store serves 16 connections in all; a real server has room for more.
  TYPESAFE_DB_POOL_MAX: database.isExternal ? "10" : "3",
});

beforeAll(async () => {
  database = await createTestDatabase(10);
  fake = await startFakeLlm();
  replicas = await Promise.all([startServiceProcess(replicaEnv()), startServiceProcess(replicaEnv())]);
}, 60_000);
afterAll(async () => {
  await Promise.all(replicas.map((r) => (r.child.exitCode === null && r.child.signalCode === null ? r.stop() : undefined)));
  await fake?.close();
  await database?.close();
});

const decision = {
  model: "typesafe/service-1.13",
  state: { ticket: 4411, text: "refund requested twice" },
  questions: { duplicate: { type: "noul", instructions: "Is this a duplicate request?" } },
};
const decide = (replica: ServiceProcess, apiKey: string) => postJson(`${replica.url}/api/v1/decisions`, decision, { apiKey });
const accountRow = (accountId: string) => database.db("accounts").where({ id: accountId }).first();

describe("two replicas on one database", () => {
  it("40 concurrent calls spread over both replicas: exactly 5 reach the upstream", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 100 * 32_000 });
    const upstream = holdQuestions(fake);
    const before = fake.questionRequests().length;
    const reached = () => fake.questionRequests().length - before;
    let answered = 0;
    const allDecided = deferred();
    const check = () => {
      if (answered + reached() >= 40) allDecided.resolve();
    };
    fake.onRequestArrived = check;
    const calls = Array.from({ length: 40 }, (_, i) =>
      decide(replicas[i % 2]!, apiKey).then((response) => {
        answered++;
        check();
        return response;
      }),
    );
    await allDecided.promise;
    expect(reached()).toBe(5);
    upstream.release();
    const statuses = (await Promise.all(calls)).map((r) => r.status).sort();
    expect(statuses).toEqual([...Array(5).fill(200), ...Array(35).fill(429)]);
    await assertInvariants(database.db, accountId);
  });

  it("kill -9 of a replica holding calls: after the lease the other replica has released them and keeps serving", async () => {
    const [victim, survivor] = replicas as [ServiceProcess, ServiceProcess];
    const held = await createTestAccount(database.db, { units: 10 * 32_000 });
    const other = await createTestAccount(database.db, { units: 10 * 32_000 });
    const upstream = holdQuestions(fake);
    const inFlight = Array.from({ length: 3 }, () => decide(victim, held.apiKey).catch((err: unknown) => err));
    await waitFor(async () => (await accountRow(held.accountId)).in_flight === 3, "3 holds in the database");

    await victim.stop("SIGKILL");
    await Promise.all(inFlight);
    upstream.release();
    expect((await decide(survivor, other.apiKey)).status).toBe(200);

    await waitFor(async () => (await accountRow(held.accountId)).in_flight === 0, "the lease to expire the dead replica's holds", deadlineMs() + 15_000);
    expect(await accountRow(held.accountId)).toMatchObject({ balance: 10 * 32_000, reserved: 0 });
    expect((await decide(survivor, held.apiKey)).status).toBe(200);
    await assertInvariants(database.db, held.accountId);
    await assertInvariants(database.db, other.accountId);
  }, 60_000);
});

// Killing server sessions needs a real PostgreSQL server; CI always has one (DATABASE_URL).
if (process.env.DATABASE_URL) {
  describe("database connections killed under load", () => {
    it("no replica exits; calls in the window fail cleanly; service resumes; the money adds up", async () => {
      const survivor = replicas.find((r) => r.child.exitCode === null && r.child.signalCode === null)!;
      const { apiKey, accountId } = await createTestAccount(database.db, { units: 100 * 32_000 });
      const statuses: number[] = [];
      const load = (async () => {
        for (let i = 0; i < 30; i++) statuses.push((await decide(survivor, apiKey)).status);
      })();
      await waitFor(() => statuses.length >= 5, "some calls before the fault");
      const dbName = new URL(database.url).pathname.slice(1);
      await database.db.raw(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ? AND pid <> pg_backend_pid() AND application_name = 'typesafe'",
        [dbName],
      );
      await load;
      expect(survivor.child.exitCode).toBeNull();
      expect(statuses.every((s) => s === 200 || s === 503)).toBe(true);
      await waitFor(async () => (await decide(survivor, apiKey)).status === 200, "the service to resume");
      await waitFor(async () => (await accountRow(accountId)).in_flight === 0, "every hold to resolve");
      await assertInvariants(database.db, accountId);
    });
  });
}
