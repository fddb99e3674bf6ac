import crypto from "node:crypto";
import type { Knex } from "knex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createKnex } from "../../src/db/database.js";
import { knexMigrationNames, migrationSource, schemaMigrations } from "../../src/db/migrations/index.js";
import type { SchemaMigration } from "../../src/db/migrations/schema-migration.js";
import fs from "node:fs";
import { ADVISORY_LOCK_ID, CONCURRENT_STATEMENT_TIMEOUT, MIGRATION_ATTEMPTS, MIGRATION_LOCK_TIMEOUT, MIGRATION_STATEMENT_TIMEOUT, migrate, SchemaTooNewError, type MigrateOptions } from "../../src/db/migrator.js";
import { createLogger } from "../../src/logger.js";
import { startPrivateCluster, type PrivateCluster } from "../support/private-cluster.js";

/**
 * The release-safe runner on a real PostgreSQL server, where a reader on
 * another connection really holds locks: the server of DATABASE_URL, or a
 * private cluster of Debian's binaries.
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

const opened: Array<{ db: Knex; name: string }> = [];
afterAll(async () => {
  for (const { db, name } of opened) {
    await db.destroy();
    const admin = createKnex(serverUrl, 1);
    await admin.raw(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.destroy();
  }
});

let template: string | undefined;

/**
 * A database of its own with knex's frozen migrations applied, copied from
 * a template migrated once (each applies in a transaction of its own, which
 * takes a while).
 */
async function freshDatabase(poolMax = 4): Promise<{ db: Knex; url: string }> {
  if (!template) {
    const { db } = await createDatabase(`typesafe_migrator_template_${crypto.randomBytes(5).toString("hex")}`, 2);
    await migrate(db, { useAdvisoryLock: true, migrations: [] });
    template = opened.at(-1)!.name;
    await db.destroy();
    opened.pop();
    opened.push({ db: createKnex(serverUrl, 1), name: template });
  }
  return createDatabase(`typesafe_migrator_${crypto.randomBytes(5).toString("hex")}`, poolMax, template);
}

async function createDatabase(name: string, poolMax: number, from?: string): Promise<{ db: Knex; url: string }> {
  const admin = createKnex(serverUrl, 1);
  await admin.raw(`CREATE DATABASE ${name}${from ? ` TEMPLATE ${from}` : ""}`);
  await admin.destroy();
  const url = new URL(serverUrl);
  url.pathname = `/${name}`;
  const db = createKnex(url.toString(), poolMax);
  opened.push({ db, name });
  return { db, url: url.toString() };
}

interface LogLine {
  level: string;
  msg: string;
  [field: string]: unknown;
}

function recordingLogger(onLine: (line: LogLine) => void = () => {}) {
  const lines: LogLine[] = [];
  const logger = createLogger("debug", {}, (text) => {
    const line = JSON.parse(text) as LogLine;
    lines.push(line);
    onLine(line);
  });
  return { logger, lines };
}

const addWidgets: SchemaMigration = {
  name: "29990101000000_create_widgets",
  transactional: true,
  up: async (trx) => {
    await trx.raw("CREATE TABLE widgets (id bigint PRIMARY KEY, account_id uuid REFERENCES accounts (id))");
  },
};
const addWidgetColour: SchemaMigration = {
  name: "29990101000100_add_widget_colour",
  transactional: true,
  up: async (trx) => {
    await trx.raw("ALTER TABLE widgets ADD COLUMN colour text");
  },
};
const indexWidgetColour: SchemaMigration = {
  name: "29990101000200_index_widget_colour",
  transactional: false,
  statements: ["CREATE INDEX CONCURRENTLY IF NOT EXISTS widgets_colour ON widgets (colour)"],
};
const base: MigrateOptions = { useAdvisoryLock: true, retryBaseMs: 10, lockTimeout: "200ms" };

async function appliedSchemaMigrations(db: Knex): Promise<Array<{ name: string; applied_by: string; served_from: string | null }>> {
  return db("schema_migrations").select("name", "applied_by", "served_from").orderBy("name");
}

describe("the release-safe runner", () => {
  it("records its migrations apart and leaves knex's table exactly as older releases check it", async () => {
    const { db } = await freshDatabase();
    const migrations = [...schemaMigrations, addWidgets, addWidgetColour, indexWidgetColour];
    await migrate(db, { ...base, migrations });

    expect((await db("knex_migrations").pluck("name")).sort()).toEqual([...knexMigrationNames].sort());
    // What knex itself checks at an older release's start: no "corrupt directory", nothing to do.
    const [, pending] = (await db.migrate.list({ migrationSource })) as [unknown[], unknown[]];
    expect(pending).toEqual([]);
    await expect(db.migrate.latest({ migrationSource })).resolves.toEqual([expect.any(Number), []]);

    const applied = await appliedSchemaMigrations(db);
    expect(applied.map((row) => row.name)).toEqual(migrations.map((m) => m.name));
    expect(new Set(applied.map((row) => row.applied_by))).toEqual(new Set([indexWidgetColour.name]));
    const { rows } = await db.raw<{ rows: Array<{ valid: boolean }> }>(
      "SELECT i.indisvalid AS valid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 'widgets_colour'",
    );
    expect(rows).toEqual([{ valid: true }]);
  });

  it("runs each migration in a transaction of its own: a failing one keeps the ones before it and records nothing of itself", async () => {
    const { db } = await freshDatabase();
    const failing: SchemaMigration = {
      name: "29990101000150_fail_half_way",
      transactional: true,
      up: async (trx) => {
        await trx.raw("ALTER TABLE widgets ADD COLUMN half_done text");
        await trx.raw("SELECT no_such_function()");
      },
    };
    await expect(migrate(db, { ...base, migrations: [addWidgets, addWidgetColour, failing] })).rejects.toThrow(/29990101000150_fail_half_way/);
    expect((await appliedSchemaMigrations(db)).map((row) => row.name)).toEqual([addWidgets.name, addWidgetColour.name]);
    const { rows } = await db.raw<{ rows: Array<{ column_name: string }> }>(
      "SELECT column_name FROM information_schema.columns WHERE table_name = 'widgets' ORDER BY column_name",
    );
    expect(rows.map((row) => row.column_name)).toEqual(["account_id", "colour", "id"]);
  });

  it("sets its timeouts in each migration's own transaction", async () => {
    const { db } = await freshDatabase();
    const seen: Array<Record<string, string>> = [];
    const probe: SchemaMigration = {
      name: "29990101000300_probe_settings",
      transactional: true,
      up: async (trx) => {
        const { rows } = await trx.raw<{ rows: Array<Record<string, string>> }>(
          "SELECT current_setting('lock_timeout') AS lock_timeout, current_setting('statement_timeout') AS statement_timeout",
        );
        seen.push(rows[0]!);
      },
    };
    await migrate(db, { useAdvisoryLock: true, migrations: [probe] });
    expect(seen).toEqual([{ lock_timeout: "2s", statement_timeout: "1min" }]);
  });

  it("is described with its own figures in docs/upgrades.md", () => {
    const page = fs.readFileSync("docs/upgrades.md", "utf8");
    expect(page).toContain(`\`lock_timeout = ${MIGRATION_LOCK_TIMEOUT}\` and \`statement_timeout = ${MIGRATION_STATEMENT_TIMEOUT}\``);
    expect(page).toContain(`up to ${MIGRATION_ATTEMPTS} attempts`);
    expect(page).toContain(`with a ${CONCURRENT_STATEMENT_TIMEOUT.replace("min", " min")} statement timeout`);
  });

  it("gives a lock back when it cannot have it in time, and tries again until a long reader is done", async () => {
    const { db, url } = await freshDatabase();
    await migrate(db, { ...base, migrations: [addWidgets] });
    const reader = await readerOfWidgets(db, url);
    const { logger, lines } = recordingLogger((line) => {
      if (line.msg.startsWith("migration did not get its locks")) reader.release();
    });
    await migrate(db, { ...base, logger, migrations: [addWidgets, addWidgetColour] });
    await reader.done();
    const retries = lines.filter((line) => line.msg.startsWith("migration did not get its locks"));
    expect(retries.length).toBeGreaterThanOrEqual(1);
    expect(retries[0]).toMatchObject({ level: "warn", migration: addWidgetColour.name, attempt: 1, code: "55P03" });
    expect((await appliedSchemaMigrations(db)).map((row) => row.name)).toEqual([addWidgets.name, addWidgetColour.name]);
  });

  it("stops after a bounded number of attempts, naming the migration", async () => {
    const { db, url } = await freshDatabase();
    await migrate(db, { ...base, migrations: [addWidgets] });
    const reader = await readerOfWidgets(db, url);
    const { logger, lines } = recordingLogger();
    await expect(migrate(db, { ...base, logger, attempts: 3, migrations: [addWidgets, addWidgetColour] })).rejects.toThrow(
      /migration 29990101000100_add_widget_colour failed after 3 attempts: .*lock timeout/,
    );
    reader.release();
    await reader.done();
    expect(lines.filter((line) => line.msg.startsWith("migration did not get its locks")).map((line) => line.attempt)).toEqual([1, 2]);
    expect((await appliedSchemaMigrations(db)).map((row) => row.name)).toEqual([addWidgets.name]);
  });

  it("rebuilds an index that a failed concurrent build left invalid", async () => {
    const { db } = await freshDatabase();
    await migrate(db, { ...base, migrations: [addWidgets, addWidgetColour] });
    // A unique index over duplicates fails half way and stays, invalid.
    await db("widgets").insert([
      { id: 1, colour: "red" },
      { id: 2, colour: "red" },
    ]);
    const unique: SchemaMigration = {
      name: "29990101000400_unique_widget_colour",
      transactional: false,
      statements: ["CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS widgets_colour_unique ON widgets (colour)"],
    };
    await expect(migrate(db, { ...base, migrations: [addWidgets, addWidgetColour, unique] })).rejects.toThrow(/could not create unique index/);
    await db("widgets").where({ id: 2 }).update({ colour: "blue" });
    await migrate(db, { ...base, migrations: [addWidgets, addWidgetColour, unique] });
    const { rows } = await db.raw<{ rows: Array<{ valid: boolean }> }>(
      "SELECT i.indisvalid AS valid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 'widgets_colour_unique'",
    );
    expect(rows).toEqual([{ valid: true }]);
  });

  it("on a current schema only reads the migrations tables, without the advisory lock (each CLI command and start makes this check)", async () => {
    const { db, url } = await freshDatabase();
    const migrations = [...schemaMigrations, addWidgets];
    await migrate(db, { ...base, migrations });
    // Another replica holds the lock: a migrate that asked for it would wait until the test's timeout.
    const holder = createKnex(url, 1);
    try {
      await holder.raw("SELECT pg_advisory_lock(?)", [ADVISORY_LOCK_ID]);
      const statements: string[] = [];
      db.on("query", (query: { sql: string }) => statements.push(query.sql));
      await migrate(db, { ...base, migrations });
      expect(statements.length).toBeLessThanOrEqual(3);
      expect(statements.join("\n")).not.toMatch(/knex_migrations_lock|CREATE|INSERT/i);
      // One migration missing: the same call migrates, once the lock is free.
      await holder.raw("SELECT pg_advisory_unlock(?)", [ADVISORY_LOCK_ID]);
      await migrate(db, { ...base, migrations: [...migrations, addWidgetColour] });
      expect((await appliedSchemaMigrations(db)).map((row) => row.name)).toContain(addWidgetColour.name);
    } finally {
      await holder.destroy();
    }
  });

  it("replicas starting at once apply each migration once", async () => {
    const { db, url } = await freshDatabase();
    const other = createKnex(url, 4);
    try {
      const migrations = [...schemaMigrations, addWidgets, addWidgetColour];
      await Promise.all([migrate(db, { ...base, migrations }), migrate(other, { ...base, migrations })]);
      expect((await appliedSchemaMigrations(db)).map((row) => row.name)).toEqual(migrations.map((m) => m.name));
    } finally {
      await other.destroy();
    }
  });
});

describe("an older release on a newer schema", () => {
  it("serves on a newer release's expand migrations, and says so", async () => {
    const { db } = await freshDatabase();
    await migrate(db, { ...base, migrations: [addWidgets, addWidgetColour] });
    const { logger, lines } = recordingLogger();
    await expect(migrate(db, { ...base, logger, migrations: [addWidgets] })).resolves.toBeUndefined();
    expect(lines).toContainEqual(
      expect.objectContaining({ msg: "serving on a newer schema", schema: addWidgets.name, database_schema: addWidgetColour.name, newer_migrations: [addWidgetColour.name] }),
    );
  });

  it("refuses, naming both schemas, a contract migration that serves only newer releases", async () => {
    const { db } = await freshDatabase();
    const dropColour: SchemaMigration = {
      name: "29990101000500_drop_widget_colour",
      transactional: true,
      servedFrom: addWidgetColour.name,
      up: async (trx) => {
        await trx.raw("ALTER TABLE widgets DROP COLUMN colour");
      },
    };
    await migrate(db, { ...base, migrations: [addWidgets, addWidgetColour, dropColour] });
    // The release that stopped using the column serves on; the one before it does not.
    await expect(migrate(db, { ...base, migrations: [addWidgets, addWidgetColour] })).resolves.toBeUndefined();
    const refusal = await migrate(db, { ...base, migrations: [addWidgets] }).catch((err: unknown) => err);
    expect(refusal).toBeInstanceOf(SchemaTooNewError);
    expect((refusal as Error).message).toBe(
      "this release (schema 29990101000000_create_widgets) cannot serve this database (schema 29990101000500_drop_widget_colour): " +
        "its migration 29990101000500_drop_widget_colour serves releases from schema 29990101000100_add_widget_colour on; start that release or a newer one",
    );
  });

  it("refuses a database migrated by a release that does not descend from this one", async () => {
    const { db } = await freshDatabase();
    await migrate(db, { ...base, migrations: [addWidgets, addWidgetColour] });
    await expect(migrate(db, { ...base, migrations: [addWidgets, indexWidgetColour] })).rejects.toThrow(
      /lacks this release's migration 29990101000200_index_widget_colour but has newer ones/,
    );
  });
});

/** Waits until some session holds a lock on the table (a condition, not a sleep). */
/**
 * A reader in a transaction holding ACCESS SHARE on widgets (taken once its
 * statement has run) until released; done() waits for it to end and closes it.
 */
async function readerOfWidgets(db: Knex, url: string): Promise<{ release: () => void; done: () => Promise<void> }> {
  const reader = createKnex(url, 1);
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  const holding = reader.transaction(async (trx) => {
    await trx.raw("SELECT count(*) FROM widgets");
    await released;
  });
  await waitForLock(db, "widgets");
  return {
    release,
    done: async () => {
      await holding;
      await reader.destroy();
    },
  };
}

async function waitForLock(db: Knex, table: string): Promise<void> {
  for (;;) {
    const { rows } = await db.raw<{ rows: Array<{ held: boolean }> }>(
      "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = ? AND l.granted AND l.pid <> pg_backend_pid()) AS held",
      [table],
    );
    if (rows[0]!.held) return;
    await new Promise((resolve) => setImmediate(resolve));
  }
}
