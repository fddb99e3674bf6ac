import { afterAll, beforeAll, expect, it } from "vitest";
import { migrate } from "../../src/db/database.js";
import { migrationSource } from "../../src/db/migrations/index.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";

/**
 * A start on a database whose migrations are all applied checks that with
 * one query and leaves knex out; anything else still goes through knex.
 */
let store: TestDatabase;
// migrate(db, { useAdvisoryLock: store.isExternal }): the advisory lock replicas share holds a connection of its own, which an embedded store's pool of one lacks.
beforeAll(async () => {
  store = await createTestDatabase(2, { changesSchema: true });
});
afterAll(async () => {
  await store?.close();
});

it("a restart on an up-to-date database starts even with knex's migration lock left taken by a crash", async () => {
  const { db } = store;
  await db("knex_migrations_lock").update({ is_locked: 1 });
  try {
    // knex alone refuses to start over a taken lock, even with nothing to migrate.
    await expect(db.migrate.latest({ migrationSource })).rejects.toThrow(/locked/i);
    await expect(migrate(db, { useAdvisoryLock: store.isExternal })).resolves.toBeUndefined();
  } finally {
    await db("knex_migrations_lock").update({ is_locked: 0 });
  }
});

it("a database that has a migration this build does not know is refused, not started on", async () => {
  const { db } = store;
  await db("knex_migrations").insert({ name: "29990101000000_from_a_newer_build", batch: 99, migration_time: new Date() });
  try {
    await expect(migrate(db, { useAdvisoryLock: store.isExternal })).rejects.toThrow(/29990101000000_from_a_newer_build/);
  } finally {
    await db("knex_migrations").where({ name: "29990101000000_from_a_newer_build" }).delete();
  }
  await expect(migrate(db, { useAdvisoryLock: store.isExternal })).resolves.toBeUndefined();
});

it("a database without this build's newest migration gets it", async () => {
  const { db } = store;
  const newest = [...(await migrationSource.getMigrations([]))].sort().at(-1)!;
  await (await migrationSource.getMigration(newest)).down!(db);
  await db("knex_migrations").where({ name: newest }).delete();
  await migrate(db, { useAdvisoryLock: store.isExternal });
  expect(await db("knex_migrations").pluck("name")).toContain(newest);
  const { rows } = await db.raw<{ rows: Array<{ expired: number }> }>("SELECT metering_sweep(now(), 1) AS expired");
  expect(rows[0]!.expired).toBe(0);
});
