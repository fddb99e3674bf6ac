import { afterAll, beforeAll, expect, it } from "vitest";
import { schemaMigrations } from "../../src/db/migrations/index.js";
import type { SchemaMigration } from "../../src/db/migrations/schema-migration.js";
import { lintMigrations, squawkFindings } from "../support/migration-lint.js";
import { startPrivateCluster, type PrivateCluster } from "../support/private-cluster.js";

/**
 * The migration lint (`npm run lint:migrations`, a CI step) refuses each
 * kind of change an older release serving beside the migration cannot
 * survive, and lets the safe form of each through.
 */
let cluster: PrivateCluster | undefined;
let serverUrl: string;
beforeAll(async () => {
  if (process.env.DATABASE_URL) {
    serverUrl = process.env.DATABASE_URL;
  } else {
    cluster = await startPrivateCluster();
    serverUrl = cluster.url;
  }
});
afterAll(() => cluster?.stop());

const sql = (name: string, statement: string): SchemaMigration => ({ name, transactional: true, up: async (trx) => void (await trx.raw(statement)) });

it("passes this build's migrations, and lets the frozen knex ones through with the reason", async () => {
  const result = await lintMigrations(serverUrl);
  expect(result.migrations.filter((m) => !m.allowedBecause).map((m) => m.name)).toEqual(schemaMigrations.map((m) => m.name));
  for (const migration of result.migrations) expect({ name: migration.name, problems: migration.problems }).toEqual({ name: migration.name, problems: [] });
  expect(result.migrations.filter((m) => m.allowedBecause).length).toBeGreaterThan(0);
});

it("flags each unsafe change, and passes its safe form", async () => {
  const setup = sql("29990101000000_create_widgets", "CREATE TABLE widgets (id bigint PRIMARY KEY, colour text, size bigint, depth bigint, label text)");
  const cases: Array<[SchemaMigration, RegExp]> = [
    [sql("29990101000100_drop_column", "ALTER TABLE widgets DROP COLUMN colour"), /ban-drop-column/],
    [sql("29990101000200_rename_column", "ALTER TABLE widgets RENAME COLUMN size TO width"), /renaming-column/],
    [sql("29990101000300_change_type", "ALTER TABLE widgets ALTER COLUMN depth TYPE numeric"), /changing-column-type/],
    [sql("29990101000400_required_column", "ALTER TABLE widgets ADD COLUMN weight bigint NOT NULL"), /adding-required-field/],
    [sql("29990101000500_plain_index", "CREATE INDEX widgets_label ON widgets (label)"), /require-concurrent-index-creation/],
    [sql("29990101000600_function", "CREATE FUNCTION widget_count() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) FROM widgets'"), /^$/],
    [sql("29990101000700_function_in_place", "CREATE OR REPLACE FUNCTION widget_count() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) + 0 FROM widgets'"), /changes function widget_count\(\) in place/],
    [sql("29990101000800_drop_function", "DROP FUNCTION widget_count()"), /drops function widget_count\(\)/],
    [sql("29990101000900_nullable_column", "ALTER TABLE widgets ADD COLUMN height bigint"), /^$/],
    [sql("29990101001000_column_with_constant_default", "ALTER TABLE widgets ADD COLUMN shape text NOT NULL DEFAULT 'round'"), /^$/],
    [sql("29990101001200_two_hot_tables", "ALTER TABLE accounts ADD COLUMN note text; ALTER TABLE ledger ADD COLUMN note text"), /blocks writes to 2 hot tables until it commits \(accounts, ledger\)/],
    [sql("29990101001300_one_hot_table", "ALTER TABLE api_keys ADD COLUMN note text"), /^$/],
    [{ name: "29990101001100_concurrent_index", transactional: false, statements: ["CREATE INDEX CONCURRENTLY IF NOT EXISTS widgets_size ON widgets (width)"] }, /^$/],
  ];
  const result = await lintMigrations(serverUrl, [setup, ...cases.map(([migration]) => migration)]);
  const problems = Object.fromEntries(result.migrations.map((m) => [m.name, m.problems.join("\n")]));
  for (const [migration, expected] of cases) expect({ name: migration.name, problems: problems[migration.name] }).toEqual({ name: migration.name, problems: expect.stringMatching(expected) });
});

it("would flag a migration without the runner's timeout settings", async () => {
  // The runner sets them before every migration (test/db/migrator.test.ts); here, the same SQL without them.
  const result = await lintMigrations(serverUrl, [sql("29990101000000_create_gadgets", "CREATE TABLE gadgets (id bigint PRIMARY KEY)"), sql("29990101000100_add_gadget_colour", "ALTER TABLE gadgets ADD COLUMN colour text")]);
  const captured = result.migrations.find((m) => m.name === "29990101000100_add_gadget_colour")!.sql;
  expect(captured).toMatch(/SET LOCAL lock_timeout = '2s';[\s\S]*SET LOCAL statement_timeout = '60s';[\s\S]*ALTER TABLE gadgets/);
  const withoutTimeouts = captured.replace(/^SET LOCAL .*$/gm, "");
  expect(squawkFindings({ "29990101000100_add_gadget_colour": withoutTimeouts }).join("\n")).toMatch(/require-lock-timeout[\s\S]*require-statement-timeout/);
  expect(squawkFindings({ "29990101000100_add_gadget_colour": captured })).toEqual([]);
});
