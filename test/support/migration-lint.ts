import { spawnSync } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { Knex } from "knex";
import { createKnex } from "../../src/db/database.js";
import { knexMigrationNames, schemaMigrations } from "../../src/db/migrations/index.js";
import type { SchemaMigration } from "../../src/db/migrations/schema-migration.js";
import { migrate } from "../../src/db/migrator.js";
import { createLogger } from "../../src/logger.js";

/**
 * Why the knex migrations, written before the release-safe rules, are let
 * through. They are frozen: none is ever applied again to a database that
 * serves, since every release since then has them all.
 */
const KNEX_MIGRATIONS_ALLOWED_BECAUSE =
  "written before the release-safe rules; frozen, and applied only to databases of releases older than the first release-safe one";

/**
 * squawk's rules that do not fit this schema: money and counters have their
 * width chosen per column (integer counters are bounded by CHECKs), and
 * `varchar`/`timestamp` are never used anyway.
 */
/** The tables every metered call writes: a migration may block writes to one of them at most. */
export const HOT_TABLES = ["accounts", "api_keys", "ledger", "requests"];
/** Lock modes that conflict with a call's row writes (ROW EXCLUSIVE). */
const BLOCKS_WRITES = ["ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock"];

const EXCLUDED_RULES = ["prefer-bigint-over-int", "prefer-bigint-over-smallint", "prefer-identity", "prefer-robust-stmts"];

export interface LintedMigration {
  name: string;
  sql: string;
  /** Empty when the migration passes. */
  problems: string[];
  allowedBecause?: string;
}

export interface LintResult {
  migrations: LintedMigration[];
  /** squawk's own report of the migrations that must pass. */
  report: string;
}

/**
 * Applies every migration, one at a time, to a fresh database on the server
 * at serverUrl, records the SQL each one really runs (the runner's timeout
 * settings included), and lints it: with squawk, PostgreSQL's migration
 * linter, and with a check squawk lacks, that no migration changes or drops a
 * function an older release calls (a contract migration, with `servedFrom`,
 * may drop one).
 */
export async function lintMigrations(serverUrl: string, migrations: readonly SchemaMigration[] = schemaMigrations): Promise<LintResult> {
  const name = `typesafe_lint_${crypto.randomBytes(5).toString("hex")}`;
  const admin = createKnex(serverUrl, 1);
  await admin.raw(`CREATE DATABASE ${name}`);
  const url = new URL(serverUrl);
  url.pathname = `/${name}`;
  const db = createKnex(url.toString(), 3);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-lint-"));
  try {
    const captured = new Map<string, string[]>();
    let current: string | undefined;
    db.on("query", (query: { sql: string }) => {
      if (current) captured.get(current)!.push(query.sql.trim().replace(/;?$/, ";"));
    });
    const logger = createLogger("debug", {}, (line) => {
      const event = JSON.parse(line) as { msg: string; migration?: string };
      if (event.msg === "applying migration") {
        current = event.migration!;
        captured.set(current, []);
      } else if (event.msg === "migration applied" || event.msg.startsWith("migration did not get")) {
        current = undefined;
      }
    });
    await migrate(db, { useAdvisoryLock: false, logger, migrations: [] });
    const linted: LintedMigration[] = [];
    for (let i = 0; i < migrations.length; i++) {
      const migration = migrations[i]!;
      const before = await functionsOf(db);
      let blocked: string[] = [];
      // The locks a transactional migration holds at its end are held until its commit.
      const observed: SchemaMigration = migration.transactional
        ? {
            ...migration,
            up: async (trx) => {
              await migration.up(trx);
              blocked = await hotTablesBlocked(trx);
            },
          }
        : migration;
      await migrate(db, { useAdvisoryLock: false, logger, migrations: [...migrations.slice(0, i), observed] });
      const after = await functionsOf(db);
      const problems: string[] = [];
      if (blocked.length > 1) {
        problems.push(`blocks writes to ${blocked.length} hot tables until it commits (${blocked.join(", ")}): split it, one table a migration`);
      }
      for (const [signature, definition] of before) {
        const now = after.get(signature);
        if (now === undefined && migration.servedFrom === undefined) {
          problems.push(`drops function ${signature}, which an older release may call: only a contract migration (servedFrom) may`);
        } else if (now !== undefined && now !== definition) {
          problems.push(`changes function ${signature} in place: create a new function beside it instead`);
        }
      }
      linted.push({ name: migration.name, sql: captured.get(migration.name)?.join("\n") ?? "", problems });
    }
    const report = runSquawk(dir, linted);
    const allowed = knexMigrationNames.map((knexName) => ({ name: knexName, sql: "", problems: [], allowedBecause: KNEX_MIGRATIONS_ALLOWED_BECAUSE }));
    return { migrations: [...allowed, ...linted], report };
  } finally {
    await db.destroy();
    await admin.raw(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.destroy();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

async function hotTablesBlocked(trx: Knex.Transaction): Promise<string[]> {
  const { rows } = await trx.raw<{ rows: Array<{ name: string }> }>(
    "SELECT DISTINCT c.relname AS name FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE l.pid = pg_backend_pid() AND l.mode = ANY(?) AND c.relname = ANY(?) ORDER BY 1",
    [BLOCKS_WRITES, HOT_TABLES],
  );
  return rows.map((row) => row.name);
}

async function functionsOf(db: Knex): Promise<Map<string, string>> {
  const { rows } = await db.raw<{ rows: Array<{ signature: string; definition: string }> }>(`
    SELECT p.oid::regprocedure::text AS signature, pg_get_functiondef(p.oid) AS definition
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = current_schema() AND p.prokind IN ('f', 'p')`);
  return new Map(rows.map((row) => [row.signature, row.definition]));
}

/** squawk's findings on the given SQL, one line each (`name.sql:line:column: …`). */
export function squawkFindings(sqlByName: Record<string, string>): string[] {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-lint-"));
  try {
    const migrations = Object.entries(sqlByName).map(([name, sql]) => ({ name, sql, problems: [] as string[] }));
    runSquawk(dir, migrations);
    return migrations.flatMap((migration) => migration.problems.map((problem) => `${migration.name}.sql:${problem}`));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** squawk on each migration's SQL; its findings become the migration's problems. */
function runSquawk(dir: string, migrations: LintedMigration[]): string {
  if (migrations.length === 0) return "no release-safe migration to lint";
  const files = migrations.map((migration) => {
    const file = path.join(dir, `${migration.name}.sql`);
    fs.writeFileSync(file, migration.sql + "\n");
    return file;
  });
  const squawk = path.resolve(import.meta.dirname, "../../node_modules/.bin/squawk");
  const result = spawnSync(squawk, ["--pg-version", "15", "--exclude", EXCLUDED_RULES.join(","), "--reporter", "gcc", ...files], {
    encoding: "utf8",
    env: { ...process.env, NO_COLOR: "1" },
  });
  if (result.error) throw result.error;
  const report = `${result.stdout}${result.stderr}`.replaceAll(`${dir}/`, "");
  for (const migration of migrations) {
    for (const line of report.split("\n")) {
      if (line.startsWith(`${migration.name}.sql:`)) migration.problems.push(line.slice(migration.name.length + ".sql:".length));
    }
  }
  if (result.status !== 0 && migrations.every((migration) => migration.problems.length === 0)) {
    throw new Error(`squawk failed without naming a migration:\n${report}`);
  }
  return report;
}
