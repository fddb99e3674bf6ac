import knex, { type Knex } from "knex";
import pg from "pg";
import type { Logger } from "../logger.js";
import { migrationSource, schemaMigrations } from "./migrations/index.js";

// int8 (bigint) columns hold money in integer units, always below 2^53.
pg.types.setTypeParser(pg.types.builtins.INT8, (value) => Number(value));

export interface Database {
  db: Knex;
  /** Where the store is reachable, for the operator CLI ("embedded" or "external"). */
  kind: "embedded" | "external";
  close(): Promise<void>;
}

export interface DatabaseOptions {
  databaseUrl: string | undefined;
  dataDir: string;
  logger: Logger;
  /** Connections of the pool, to the server or to the embedded store's wire. */
  poolMax?: number;
}

/**
 * Opens the store and brings its schema up to date. With a DATABASE_URL it is
 * that PostgreSQL server; otherwise an embedded PGlite persisted in dataDir,
 * served on a loopback socket so that the same `pg` driver, dialect and
 * queries are used either way.
 */
export async function openDatabase(options: DatabaseOptions): Promise<Database> {
  if (options.databaseUrl) {
    const db = createKnex(options.databaseUrl, options.poolMax ?? 10, options.logger);
    await migrate(db, true);
    return { db, kind: "external", close: () => db.destroy() };
  }
  const { openEmbeddedStore } = await import("./embedded.js");
  const store = await openEmbeddedStore(options.dataDir, options.logger);
  const db = createKnex(store.url, options.poolMax ?? 10, options.logger);
  try {
    await migrate(db, false);
  } catch (err) {
    await db.destroy();
    await store.close();
    throw err;
  }
  return {
    db,
    kind: "embedded",
    close: async () => {
      await db.destroy();
      await store.close();
    },
  };
}

/**
 * A knex instance on the pg driver. knex's own log lines go to the given
 * logger (stdout must stay clean for the CLI's JSON).
 */
export function createKnex(connectionString: string, poolMax: number, logger?: Logger): Knex {
  const forward = (level: "warn" | "error") => (message: unknown) =>
    logger?.[level]("knex", { detail: message instanceof Error ? message.message : String(message) });
  return knex({
    log: { warn: forward("warn"), error: forward("error"), deprecate: () => {}, debug: () => {} },
    client: "pg",
    connection: {
      connectionString,
      application_name: "typesafe",
      // A partitioned client must never hold an account lock for long.
      statement_timeout: 10_000,
      idle_in_transaction_session_timeout: 10_000,
    } as Knex.PgConnectionConfig,
    pool: { min: 0, max: poolMax },
    acquireConnectionTimeout: 10_000,
  });
}

/**
 * Applies pending migrations. Several replicas may start at once: a
 * session-level advisory lock makes the others wait instead of failing on
 * knex's own migration lock. The lock holds one pooled connection, so the
 * pool needs at least two.
 */
export async function migrate(db: Knex, useAdvisoryLock: boolean): Promise<void> {
  await migrateKnex(db, useAdvisoryLock);
  await applySchemaMigrationsInterim(db);
}

/**
 * Interim, until the release-safe runner lands: applies each pending
 * release-safe migration in a transaction of its own, under a transaction
 * advisory lock, and records it in schema_migrations.
 */
async function applySchemaMigrationsInterim(db: Knex): Promise<void> {
  const { rows } = await db.raw<{ rows: Array<{ present: boolean }> }>("SELECT to_regclass('schema_migrations') IS NOT NULL AS present");
  if (rows[0]?.present) {
    const applied = new Set(await db("schema_migrations").pluck<string[]>("name"));
    if (schemaMigrations.every((m) => applied.has(m.name))) return;
  }
  await db.raw("CREATE TABLE IF NOT EXISTS schema_migrations (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())");
  for (const migration of schemaMigrations) {
    await db.transaction(async (tx) => {
      await tx.raw("SELECT pg_advisory_xact_lock(7261124)");
      if (await tx("schema_migrations").where({ name: migration.name }).first()) return;
      await migration.up(tx);
      await tx("schema_migrations").insert({ name: migration.name });
    });
  }
}

async function migrateKnex(db: Knex, useAdvisoryLock: boolean): Promise<void> {
  if (await isUpToDate(db)) return;
  if (!useAdvisoryLock) {
    await db.migrate.latest({ migrationSource });
    return;
  }
  const lockId = 7_261_123; // any constant shared by every replica
  const connection = await db.client.acquireConnection();
  try {
    await connection.query("SELECT pg_advisory_lock($1)", [lockId]);
    try {
      await db.migrate.latest({ migrationSource });
    } finally {
      await connection.query("SELECT pg_advisory_unlock($1)", [lockId]);
    }
  } finally {
    await db.client.releaseConnection(connection);
  }
}

/**
 * True when the applied migrations are exactly this build's: a restart's
 * common case, told by one query instead of knex's table checks, lock and
 * listing. Anything else, including a database that
 * knows a migration this build does not, goes through knex, which migrates or
 * refuses.
 */
async function isUpToDate(db: Knex): Promise<boolean> {
  const { rows } = await db.raw<{ rows: Array<{ present: boolean }> }>("SELECT to_regclass('knex_migrations') IS NOT NULL AS present");
  if (!rows[0]?.present) return false;
  // Both sorted here: the database's collation need not order names as JavaScript does.
  const applied = (await db("knex_migrations").pluck<string[]>("name")).sort();
  const known = [...(await migrationSource.getMigrations([]))].sort();
  return applied.length === known.length && applied.every((name, i) => name === known[i]);
}
