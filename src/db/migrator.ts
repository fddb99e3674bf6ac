import { setTimeout as delay } from "node:timers/promises";
import type { Knex } from "knex";
import type { Logger } from "../logger.js";
import { knexMigrationNames, migrationSource as knexMigrationSource, schemaMigrations } from "./migrations/index.js";
import type { NonTransactionalMigration, SchemaMigration, TransactionalMigration } from "./migrations/schema-migration.js";

/**
 * How long a migration's statement waits for a lock before it gives up, and
 * everything queued behind it on that table with it. Short on purpose: while
 * an ALTER waits for a table, every call's statement on that table waits
 * behind it, so this bounds the stall a busy reader can cause.
 */
export const MIGRATION_LOCK_TIMEOUT = "2s";
/** A transactional migration changes the catalogue and small tables only. */
export const MIGRATION_STATEMENT_TIMEOUT = "60s";
/** `CREATE INDEX CONCURRENTLY` scans the table twice and waits for old transactions. */
export const CONCURRENT_STATEMENT_TIMEOUT = "30min";
/** Attempts of one migration that did not get its locks, with waits between them. */
export const MIGRATION_ATTEMPTS = 10;

/** PostgreSQL's lock_not_available (lock_timeout) and deadlock_detected. */
const LOCK_NOT_HAD = new Set(["55P03", "40P01"]);
/** Any constant shared by every replica and the operator CLI. */
export const ADVISORY_LOCK_ID = 7_261_123;
/** How often a replica asks again for the lock another one holds while it migrates. */
const ADVISORY_LOCK_POLL_MS = 100;

export interface MigrateOptions {
  /** Replicas starting at once wait for each other (needs a pool of two). */
  useAdvisoryLock: boolean;
  logger?: Logger;
  /** This build's release-safe migrations; tests pass others. */
  migrations?: readonly SchemaMigration[];
  /** Tests shorten the waits and attempts. */
  retryBaseMs?: number;
  attempts?: number;
  lockTimeout?: string;
}

/** A database this release must not serve: migrated by a newer release past what this one tolerates. */
export class SchemaTooNewError extends Error {
  override name = "SchemaTooNewError";
}

interface AppliedRow {
  name: string;
  applied_by: string;
  served_from: string | null;
}

/**
 * Brings the schema up to date, safely while replicas of the previous
 * release serve. The frozen knex migrations stay recorded by knex (older
 * releases compare knex's table with their own list at start); every newer
 * migration is applied alone, with lock and statement timeouts, retried when
 * a lock was not had, and recorded in `schema_migrations` with the schema of
 * the release that applied it and, for a contract migration, the oldest
 * schema a release must know to serve on. A database migrated past what this
 * release tolerates is refused with one line naming both schemas.
 */
export async function migrate(db: Knex, options: MigrateOptions): Promise<void> {
  const migrations = options.migrations ?? schemaMigrations;
  const state = await readState(db);
  if (state.knexUpToDate && state.applied && !needsWork(state.applied, migrations)) {
    refuseIfTooNew(state.applied, migrations, options.logger);
    return;
  }
  await withAdvisoryLock(db, options.useAdvisoryLock, async () => {
    await applyKnexMigrations(db, options);
    await ensureBookkeeping(db, options);
    const applied = (await readState(db)).applied ?? [];
    refuseIfTooNew(applied, migrations, options.logger);
    const done = new Set(applied.map((row) => row.name));
    const schema = schemaOf(migrations);
    for (const migration of migrations) {
      if (done.has(migration.name)) continue;
      const startedAt = Date.now();
      options.logger?.debug("applying migration", { migration: migration.name });
      await withLockRetry(migration.name, options, () =>
        migration.transactional ? applyInTransaction(db, migration, schema, options) : applyOutsideTransaction(db, migration, schema, options),
      );
      options.logger?.info("migration applied", { migration: migration.name, duration_ms: Date.now() - startedAt });
    }
  });
}

/** The newest migration a release knows: the name of its schema. */
export function schemaOf(migrations: readonly SchemaMigration[]): string {
  return migrations.at(-1)?.name ?? knexMigrationNames.at(-1)!;
}

async function readState(db: Knex): Promise<{ knexUpToDate: boolean; applied: AppliedRow[] | undefined }> {
  const { rows } = await db.raw<{ rows: Array<{ knex: boolean; own: boolean }> }>(
    "SELECT to_regclass('knex_migrations') IS NOT NULL AS knex, to_regclass('schema_migrations') IS NOT NULL AS own",
  );
  const present = rows[0]!;
  let knexUpToDate = false;
  if (present.knex) {
    // Both sorted here: the database's collation need not order names as JavaScript does.
    const appliedKnex = (await db("knex_migrations").pluck<string[]>("name")).sort();
    const known = [...knexMigrationNames].sort();
    knexUpToDate = appliedKnex.length === known.length && appliedKnex.every((name, i) => name === known[i]);
  }
  const applied = present.own ? await db<AppliedRow>("schema_migrations").select("name", "applied_by", "served_from") : undefined;
  return { knexUpToDate, applied };
}

function needsWork(applied: AppliedRow[], migrations: readonly SchemaMigration[]): boolean {
  const done = new Set(applied.map((row) => row.name));
  return migrations.some((migration) => !done.has(migration.name));
}

/**
 * A newer release's migrations are served on unless one of them names, as
 * the oldest schema it serves, one this release does not know. A database
 * that lacks one of this release's migrations yet has newer ones was
 * migrated by a release that does not descend from this one.
 */
function refuseIfTooNew(applied: AppliedRow[], migrations: readonly SchemaMigration[], logger: Logger | undefined): void {
  const known = new Set(migrations.map((migration) => migration.name));
  const newer = applied.filter((row) => !known.has(row.name)).sort((a, b) => (a.name < b.name ? -1 : 1));
  if (newer.length === 0) return;
  const schema = schemaOf(migrations);
  const blocking = newer.find((row) => row.served_from !== null && !known.has(row.served_from));
  if (blocking) {
    throw new SchemaTooNewError(
      `this release (schema ${schema}) cannot serve this database (schema ${blocking.applied_by}): ` +
        `its migration ${blocking.name} serves releases from schema ${blocking.served_from} on; start that release or a newer one`,
    );
  }
  const done = new Set(applied.map((row) => row.name));
  const missing = migrations.find((migration) => !done.has(migration.name));
  if (missing) {
    throw new SchemaTooNewError(
      `this release (schema ${schema}) cannot serve this database (schema ${newer.at(-1)!.applied_by}): ` +
        `it lacks this release's migration ${missing.name} but has newer ones, so a release that does not descend from this one migrated it`,
    );
  }
  logger?.info("serving on a newer schema", { schema, database_schema: newer.at(-1)!.applied_by, newer_migrations: newer.map((row) => row.name) });
}

async function withAdvisoryLock(db: Knex, useAdvisoryLock: boolean, work: () => Promise<void>): Promise<void> {
  if (!useAdvisoryLock) return work();
  const connection = await db.client.acquireConnection();
  try {
    // Asked again and again rather than waited for: a statement waiting in pg_advisory_lock holds a snapshot,
    // and the migrating replica's CREATE INDEX CONCURRENTLY would wait for that snapshot while it holds the lock.
    while (!(await connection.query("SELECT pg_try_advisory_lock($1) AS locked", [ADVISORY_LOCK_ID])).rows[0].locked) {
      await delay(ADVISORY_LOCK_POLL_MS);
    }
    try {
      await work();
    } finally {
      await connection.query("SELECT pg_advisory_unlock($1)", [ADVISORY_LOCK_ID]);
    }
  } finally {
    await db.client.releaseConnection(connection);
  }
}

async function setLocalTimeouts(trx: Knex | Knex.Transaction, options: MigrateOptions): Promise<void> {
  await trx.raw(`SET LOCAL lock_timeout = '${options.lockTimeout ?? MIGRATION_LOCK_TIMEOUT}'`);
  await trx.raw(`SET LOCAL statement_timeout = '${MIGRATION_STATEMENT_TIMEOUT}'`);
}

/**
 * The frozen knex migrations, with the same timeouts as the rest. On a
 * database that older releases serve, each runs in a transaction of its own:
 * knex's `latest` would run them all in one, holding every table's lock
 * until the last.
 */
async function applyKnexMigrations(db: Knex, options: MigrateOptions): Promise<void> {
  const migrationSource: Knex.MigrationSource<string> = {
    getMigrations: (loadExtensions) => knexMigrationSource.getMigrations(loadExtensions),
    getMigrationName: (name) => name,
    getMigration: async (name) => {
      const migration = await knexMigrationSource.getMigration(name);
      return {
        // knex hands each migration its transaction.
        up: async (trx: Knex) => {
          await setLocalTimeouts(trx, options);
          await migration.up(trx);
        },
        down: migration.down,
      };
    },
  };
  const [applied, pending] = (await db.migrate.list({ migrationSource })) as [unknown[], unknown[]];
  if (pending.length === 0) return;
  if (applied.length === 0) {
    // A new database: nothing serves it yet, so one transaction for all of them is safe, and all or nothing.
    options.logger?.debug("applying migration", { migration: String(pending[0]) });
    await db.migrate.latest({ migrationSource });
    return;
  }
  for (const name of pending) {
    options.logger?.debug("applying migration", { migration: String(name) });
    // `up` applies the next pending one only, in its own transaction.
    await withLockRetry(`knex ${String(name)}`, options, () => db.migrate.up({ migrationSource }));
  }
}

async function ensureBookkeeping(db: Knex, options: MigrateOptions): Promise<void> {
  await withLockRetry("creating schema_migrations", options, () =>
    db.transaction(async (trx) => {
      await setLocalTimeouts(trx, options);
      await trx.raw(`
        CREATE TABLE IF NOT EXISTS schema_migrations (
          name text PRIMARY KEY,
          applied_at timestamptz NOT NULL DEFAULT now(),
          applied_by text NOT NULL,
          served_from text
        )`);
    }),
  );
}

async function applyInTransaction(db: Knex, migration: TransactionalMigration, schema: string, options: MigrateOptions): Promise<void> {
  await db.transaction(async (trx) => {
    await setLocalTimeouts(trx, options);
    await migration.up(trx);
    await trx("schema_migrations").insert({ name: migration.name, applied_by: schema, served_from: migration.servedFrom ?? null });
  });
}

async function applyOutsideTransaction(db: Knex, migration: NonTransactionalMigration, schema: string, options: MigrateOptions): Promise<void> {
  const connection: unknown = await db.client.acquireConnection();
  // Through knex on the one connection, so its query events see these statements too.
  const run = (sql: string, bindings: readonly Knex.RawBinding[] = []) => db.raw(sql, bindings).connection(connection);
  try {
    await run(`SET lock_timeout = '${options.lockTimeout ?? MIGRATION_LOCK_TIMEOUT}'`);
    await run(`SET statement_timeout = '${CONCURRENT_STATEMENT_TIMEOUT}'`);
    try {
      const { rows } = await run(
        "SELECT c.relname AS name FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE NOT i.indisvalid AND n.nspname = current_schema()",
      );
      // A concurrent build that failed leaves an invalid index, which `IF NOT EXISTS` would then keep.
      for (const { name } of rows as Array<{ name: string }>) {
        if (migration.statements.some((statement) => new RegExp(`\\b${name}\\b`).test(statement))) {
          await run(`DROP INDEX CONCURRENTLY IF EXISTS "${name}"`);
        }
      }
      for (const statement of migration.statements) await run(statement);
      await run("INSERT INTO schema_migrations (name, applied_by, served_from) VALUES (?, ?, ?)", [migration.name, schema, migration.servedFrom ?? null]);
    } finally {
      await run("RESET lock_timeout");
      await run("RESET statement_timeout");
    }
  } finally {
    await db.client.releaseConnection(connection);
  }
}

/** Runs a migration again, after a growing wait, when it did not get its locks in time. */
async function withLockRetry<T>(name: string, options: MigrateOptions, run: () => Promise<T>): Promise<T> {
  const baseMs = options.retryBaseMs ?? 250;
  for (let attempt = 1; ; attempt++) {
    try {
      return await run();
    } catch (err) {
      const code = (err as { code?: unknown }).code;
      if (typeof code !== "string" || !LOCK_NOT_HAD.has(code) || attempt >= (options.attempts ?? MIGRATION_ATTEMPTS)) {
        throw new Error(`migration ${name} failed${attempt > 1 ? ` after ${attempt} attempts` : ""}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
      }
      const waitMs = Math.round(Math.min(baseMs * 2 ** (attempt - 1), 5_000) * (0.5 + Math.random() / 2));
      options.logger?.warn("migration did not get its locks in time; trying again", { migration: name, attempt, wait_ms: waitMs, code });
      await delay(waitMs);
    }
  }
}
