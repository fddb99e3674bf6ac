import crypto from "node:crypto";
import type { Knex } from "knex";
import { afterAll, beforeAll, expect, it } from "vitest";
import { createKnex } from "../../src/db/database.js";
import { runPooled, StatementTimeoutError } from "../../src/db/pooled-statement.js";
import { isDatabaseUnavailable } from "../../src/db/unavailable.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";

/**
 * The metering hot path's statements go through pg on a pooled connection
 * instead of knex's runner; they must still look like knex statements to the
 * pool and to the metrics. A pool of one, so every statement here runs on the
 * same connection unless one is discarded.
 */
let store: TestDatabase;
let db: Knex;
beforeAll(async () => {
  store = await createTestDatabase(2); // migrating on PostgreSQL takes a second connection for its lock
  db = createKnex(store.url, 1);
});
afterAll(async () => {
  await db?.destroy();
  await store?.close();
});

/** knex's query events as src/metrics.ts reads them: the event name and the query id it carries. */
function recordQueryEvents(db: Knex): { events: string[]; stop(): void } {
  const events: string[] = [];
  const listeners = {
    query: (query: { __knexQueryUid: string }) => events.push(`query ${query.__knexQueryUid}`),
    "query-response": (_: unknown, query: { __knexQueryUid: string }) => events.push(`query-response ${query.__knexQueryUid}`),
    "query-error": (_: unknown, query: { __knexQueryUid: string }) => events.push(`query-error ${query.__knexQueryUid}`),
  };
  for (const [name, listener] of Object.entries(listeners)) db.on(name, listener);
  return { events, stop: () => Object.entries(listeners).forEach(([name, listener]) => db.off(name, listener)) };
}

const pool = (db: Knex) => db.client.pool as { numUsed(): number };

it("answers the statement's rows and reports it as one query and its response", async () => {
  const recorder = recordQueryEvents(db);
  try {
    const rows = await runPooled<{ n: number }>(db, { text: "SELECT $1::int + 1 AS n" }, [41]);
    expect(rows).toEqual([{ n: 42 }]);
  } finally {
    recorder.stop();
  }
  const [asked, answered] = recorder.events;
  expect(recorder.events).toHaveLength(2);
  expect(asked).toMatch(/^query pooled-\d+$/);
  expect(answered).toBe(`query-response ${asked!.slice("query ".length)}`);
});

it("a failing statement rejects with the database's own error, is reported as an error, and gives its connection back", async () => {
  const recorder = recordQueryEvents(db);
  let failure: unknown;
  try {
    failure = await runPooled(db, { text: "SELECT 1 / $1::int AS n" }, [0]).catch((err: unknown) => err);
  } finally {
    recorder.stop();
  }
  expect(failure).toMatchObject({ code: "22012" }); // division_by_zero
  expect(isDatabaseUnavailable(failure)).toBe(false);
  expect(recorder.events).toEqual([recorder.events[0], `query-error ${recorder.events[0]!.slice("query ".length)}`]);
  expect(pool(db).numUsed()).toBe(0);
  expect(await runPooled(db, { text: "SELECT 1 AS n" }, [])).toEqual([{ n: 1 }]);
});

it("a named statement is prepared once on its connection and then reused; an unnamed one is not kept", async () => {
  const named = { name: `test_named_${crypto.randomBytes(4).toString("hex")}`, text: "SELECT $1::text AS echo" };
  const unnamed = { text: "SELECT $1::text AS echo, 2 AS two" };
  expect(await runPooled(db, named, ["a"])).toEqual([{ echo: "a" }]);
  expect(await runPooled(db, named, ["b"])).toEqual([{ echo: "b" }]);
  expect(await runPooled(db, unnamed, ["c"])).toEqual([{ echo: "c", two: 2 }]);
  const prepared = await runPooled<{ name: string }>(
    db,
    // An unnamed statement has no name to look for: it would show as a statement with its text.
    { text: "SELECT name FROM pg_prepared_statements WHERE name = $1 OR statement = $2" },
    [named.name, unnamed.text],
  );
  expect(prepared).toEqual([{ name: named.name }]);
});

it("a reply that does not come within the deadline rejects as unavailable, and the connection is discarded, not reused", async () => {
  const pid = async () => (await runPooled<{ pid: number }>(db, { text: "SELECT pg_backend_pid() AS pid" }, []))[0]!.pid;
  const before = await pid();
  const slow = runPooled(db, { text: "SELECT pg_sleep(0.3)" }, [], 20);
  const failure = await slow.catch((err: unknown) => err);
  expect(failure).toBeInstanceOf(StatementTimeoutError);
  // Its name and message are what the log line of the failed call shows.
  expect(failure).toMatchObject({ name: "StatementTimeoutError", message: expect.stringMatching(/timeout.*20 ms/) });
  expect(isDatabaseUnavailable(failure)).toBe(true);
  const after = await pid();
  // PGlite serves every connection from its one backend session, so only a real server shows a new backend.
  if (store.isExternal) expect(after).not.toBe(before);
  expect(pool(db).numUsed()).toBe(0);
});
