import crypto from "node:crypto";
import type { Knex } from "knex";
import { inject } from "vitest";
import { createKnex, migrate } from "../../src/db/database.js";

export interface TestDatabase {
  /** Connection string a spawned server process can use. */
  url: string;
  db: Knex;
  /** True on a real PostgreSQL server, where concurrent sessions really race. */
  isExternal: boolean;
  close(): Promise<void>;
}

/**
 * A migrated database for one test file: a fresh database on the server of
 * DATABASE_URL, or the run's shared embedded store (tests then use their own
 * accounts and never assume an empty database).
 */
export async function createTestDatabase(poolMax = 10): Promise<TestDatabase> {
  const serverUrl = process.env.DATABASE_URL;
  if (!serverUrl) {
    const url = inject("embeddedDatabaseUrl");
    const db = createKnex(url, 1);
    return { url, db, isExternal: false, close: () => db.destroy() };
  }
  const name = `typesafe_test_${crypto.randomBytes(6).toString("hex")}`;
  const admin = createKnex(serverUrl, 1);
  await admin.raw(`CREATE DATABASE ${name}`);
  await admin.destroy();
  const url = new URL(serverUrl);
  url.pathname = `/${name}`;
  const db = createKnex(url.toString(), poolMax);
  await migrate(db, true);
  return {
    url: url.toString(),
    db,
    isExternal: true,
    close: async () => {
      await db.destroy();
      const cleanup = createKnex(serverUrl, 1);
      await cleanup.raw(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await cleanup.destroy();
    },
  };
}
