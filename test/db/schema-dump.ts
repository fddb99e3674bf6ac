import { execFile } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { createKnex, migrate } from "../../src/db/database.js";

/**
 * Writes src/db/schema.sql: the schema of a freshly migrated database, as
 * pg_dump --schema-only prints it, so the live body of every function and
 * table can be read whole in one file (Rails' structure.sql is the model).
 * `npm run db:schema` runs it against the PostgreSQL server of DATABASE_URL
 * (the local one by default); CI runs it and fails when the committed file
 * differs, so a migration that changes the schema comes with its new dump.
 */
const root = path.resolve(import.meta.dirname, "../..");
const SCHEMA_FILE = path.join(root, "src/db/schema.sql");

/** The dump without what changes from run to run or machine to machine: versions, session settings, pg_dump's restrict key. */
export function normalise(dump: string): string {
  const lines = dump
    .split("\n")
    .filter((line) => !/^-- Dumped (from|by) /.test(line))
    .filter((line) => !/^\\(un)?restrict /.test(line))
    .filter((line) => !/^SET [a-z_]+ = /.test(line) && !/^SELECT pg_catalog\.set_config\('search_path'/.test(line));
  return `${lines.join("\n").replace(/\n{3,}/g, "\n\n").trim()}\n`;
}

/** The normalised schema of a fresh database migrated by this build, on the server of `serverUrl`. */
export async function dumpFreshSchema(serverUrl: string): Promise<string> {
  const name = `typesafe_schema_${crypto.randomBytes(6).toString("hex")}`;
  const admin = createKnex(serverUrl, 1);
  await admin.raw(`CREATE DATABASE ${name}`);
  const url = new URL(serverUrl);
  url.pathname = `/${name}`;
  try {
    const db = createKnex(url.toString(), 2);
    try {
      await migrate(db, { useAdvisoryLock: true });
    } finally {
      await db.destroy();
    }
    const { stdout } = await promisify(execFile)("pg_dump", ["--schema-only", "--no-owner", "--no-privileges", "--dbname", url.toString()], {
      maxBuffer: 64 * 1024 * 1024,
    });
    return normalise(stdout);
  } finally {
    await admin.raw(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    await admin.destroy();
  }
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(import.meta.filename)) {
  const serverUrl = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
  const header = "-- The schema of a freshly migrated database (pg_dump --schema-only, normalised).\n-- Made by `npm run db:schema`; never edited by hand. CI fails while it differs.\n\n";
  await fs.writeFile(SCHEMA_FILE, header + (await dumpFreshSchema(serverUrl)));
  console.log(`wrote ${path.relative(root, SCHEMA_FILE)}`);
}
