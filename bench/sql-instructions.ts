/**
 * Instructions a PostgreSQL backend executes per admit + settle pair, counted
 * by valgrind's callgrind. Unlike time, the count does not move with what else
 * the machine is doing, so a change to the metering functions or tables shows
 * even on a busy 2-core VM where pairs per second vary by a third between runs.
 *
 *   npm run bench:sql
 *   BENCH_SQL_BEFORE=20261127110000_add_member_roles_and_two_factor npm run bench:sql   # also the schema as of that migration
 *
 * BENCH_SQL_BEFORE names any migration, a frozen knex one or a release-safe
 * one, from the first that has metering_grant. A throwaway cluster (Debian's
 * server binaries, as the crash test uses) gets one database per schema,
 * migrated as the service migrates, and accounts that any of those schemas
 * takes; the latest schema gets a second database whose accounts have
 * balance alerts set (thresholds and the depletion floor, as the account page
 * sets them) that the pairs never cross. Then the server stops and each
 * script of statements runs in single-user mode under callgrind, once with
 * 100 pairs and once with 300, so start-up and warm-up cancel out of the
 * difference.
 *
 * The statements are the service's own texts (ledger.ts exports them),
 * prepared once per backend as the service's named statements are, and
 * executed each in its own transaction: one admission with its own request id,
 * then its settle; and the same pairs as the meter batches them under load
 * (ten admissions in one statement, then their ten settles in one). A schema
 * older than the service's functions gets the same texts with the functions it
 * has (the name without `_v2`); a row whose function it lacks is left out.
 * The count leaves out what a batch saves most (round trips, wake-ups, WAL
 * flushes: single-user mode has none). The same-run baseline is bench:metering's
 * bare `UPDATE … RETURNING` on an account row, one statement per pair, on the
 * latest schema. Prints thousands of instructions per pair and the ratios.
 */
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import type { Knex } from "knex";
import { displayPrefix, generateApiKey, hashApiKey } from "../src/keys/api-keys.js";
import { createAccount } from "../src/admin/account-funding.js";
import { createKnex } from "../src/db/database.js";
import { migrate } from "../src/db/migrator.js";
import { knexMigrationNames, migrationSource, schemaMigrations } from "../src/db/migrations/index.js";
import { meteringStatements } from "../src/metering/ledger.js";
import { DECISION_RESERVE_UNITS_PER_QUESTION, decisionReserveUnits } from "../src/metering/meter.js";
import { setAlertSettings } from "../src/webhooks/events.js";
import { postgresBinaries, runAsClusterOwner, startPrivateCluster } from "../test/support/private-cluster.js";
import { callgrindInstructions, meteredPairScript } from "./callgrind.js";
import { BARE_STATEMENT } from "./support.js";

const BEFORE = process.env.BENCH_SQL_BEFORE;
const ACCOUNTS = 50;
const [FEW, MANY] = [100, 300];
/** Pairs per statement in the "batched" script: what the meter's batches hold under load. */
const BATCH = 10;
/** Alert thresholds of the "alerts set" accounts: 100, 10 and 1 credits, far below their balance. */
const THRESHOLDS_UNITS = [100_000_000, 10_000_000, 1_000_000];

type Kind = "bare" | "metered" | "batched";
type StatementName = keyof typeof meteringStatements;

interface Schema {
  name: string;
  database: string;
  keyHashes: string[];
  accountIds: string[];
  /** The texts this schema can run: the service's, or the same calls to the functions it has. */
  statements: Partial<Record<StatementName, string>>;
}

/** The statements each kind of script prepares. */
const NEEDS: Record<Exclude<Kind, "bare">, StatementName[]> = { metered: ["admit", "finish"], batched: ["admitMany", "finishMany"] };

/** The service's texts as `schema` can run them: with the function it has (a `_v2` name or the one before it), or none. */
function statementsOf(functions: Set<string>): Partial<Record<StatementName, string>> {
  const texts: Partial<Record<StatementName, string>> = {};
  for (const [name, statement] of Object.entries(meteringStatements) as Array<[StatementName, { text: string }]>) {
    const called = /\b(metering_\w+)\(/.exec(statement.text)![1]!;
    const older = called.replace(/_v2$/, "");
    if (functions.has(called)) texts[name] = statement.text;
    else if (functions.has(older)) texts[name] = statement.text.replace(`${called}(`, `${older}(`);
  }
  return texts;
}

/**
 * The statements of `pairs` pairs, one per line, after the PREPAREs (see
 * meteredPairScript): bare updates, the service's pairs one at a time, or
 * its pairs in batches.
 */
function pairScript(schema: Schema, pairs: number, kind: Kind): string {
  if (kind === "metered") return meteredPairScript({ admit: schema.statements.admit!, finish: schema.statements.finish! }, schema.keyHashes, pairs);
  const lines: string[] = [];
  const prepare = (name: string, text: string) => lines.push(`PREPARE ${name} AS ${text}`);
  if (kind === "bare") {
    prepare("bare", BARE_STATEMENT.text);
    for (let i = 0; i < pairs; i++) lines.push(`EXECUTE bare('${schema.accountIds[i % ACCOUNTS]}')`);
    return lines.join("\n") + "\n";
  }
  for (const name of NEEDS[kind]) prepare(name, schema.statements[name]!);
  const keyHash = (account: number) => `'\\x${schema.keyHashes[account]}'`;
  const reserve = String(decisionReserveUnits(1));
  const array = (values: string[]) => `ARRAY[${values.join(", ")}]`;
  // An ARRAY of quoted literals is text[] to EXECUTE: each argument takes the type the statement casts its parameter to.
  const execute = (name: StatementName, args: string[]) => {
    const types = [...schema.statements[name]!.matchAll(/\$\d+::(\w+\[\])/g)].map((match) => match[1]);
    return `EXECUTE ${name}(${args.map((arg, i) => `${arg}::${types[i]}`).join(", ")})`;
  };
  for (let first = 0; first < pairs; first += BATCH) {
    const accounts = Array.from({ length: BATCH }, (_, i) => (first + i) % ACCOUNTS);
    const ids = accounts.map(() => `'${crypto.randomUUID()}'`);
    const each = (value: string) => array(accounts.map(() => value));
    lines.push(
      execute("admitMany", [array(accounts.map(keyHash)), each("'decide'"), each(reserve), each("false"), each("60000"), each("NULL"), each("NULL"), each("NULL"), array(ids)]),
      execute("finishMany", [array(ids), each("true"), each("1000"), each("NULL"), each("NULL")]),
    );
  }
  return lines.join("\n") + "\n";
}

/**
 * Accounts as bench:metering's (createBenchAccounts) makes them, funded without
 * end and with limits that never bind, but with keys written in the columns of
 * the first schema, so that every schema since takes them; the columns added
 * since have defaults or are NULL.
 */
async function createAccounts(db: Knex): Promise<Array<{ id: string; keyHash: Buffer }>> {
  const accounts = [];
  for (let i = 0; i < ACCOUNTS; i++) {
    const account = await createAccount(db, { name: "bench", units: 1e15, freeRequests: 0 });
    const apiKey = generateApiKey();
    await db("api_keys").insert({ account_id: account.id, key_hash: hashApiKey(apiKey), display_prefix: displayPrefix(apiKey) });
    await db("accounts").where({ id: account.id }).update({ rate_limit: 1_000_000_000, rate_window_ms: 50, max_in_flight: 1_000 });
    accounts.push({ id: account.id, keyHash: hashApiKey(apiKey) });
  }
  return accounts;
}

/** Migrates a new database to the schema as of `until` (the latest when undefined), as the service would have. */
async function migrateUntil(db: Knex, until: string | undefined): Promise<void> {
  const knexIndex = until === undefined ? -1 : knexMigrationNames.indexOf(until);
  if (knexIndex >= 0) {
    const applied = knexMigrationNames.slice(0, knexIndex + 1);
    await db.migrate.latest({ migrationSource: { ...migrationSource, getMigrations: async () => [...applied] } });
    return;
  }
  const schemaIndex = until === undefined ? schemaMigrations.length - 1 : schemaMigrations.findIndex((m) => m.name === until);
  await migrate(db, { useAdvisoryLock: false, migrations: schemaMigrations.slice(0, schemaIndex + 1) });
}

async function main() {
  const bin = postgresBinaries();
  if (!bin) throw new Error("no PostgreSQL server binaries under /usr/lib/postgresql (Debian's postgresql package)");
  const all = [...knexMigrationNames, ...schemaMigrations.map((m) => m.name)];
  if (BEFORE && !all.includes(BEFORE)) throw new Error(`BENCH_SQL_BEFORE: no migration ${BEFORE}; one of ${all.join(", ")}`);
  const cluster = await startPrivateCluster();
  try {
    const variants: Array<{ name: string; until: string | undefined; alerts: boolean }> = [
      ...(BEFORE ? [{ name: `as of ${BEFORE}`, until: BEFORE, alerts: false }] : []),
      { name: "latest", until: undefined, alerts: false },
      { name: "latest, alerts set, never crossed", until: undefined, alerts: true },
    ];
    const schemas: Schema[] = [];
    for (const variant of variants) {
      const database = `schema_${schemas.length}`;
      const admin = createKnex(cluster.url, 1);
      await admin.raw(`CREATE DATABASE ${database}`);
      await admin.destroy();
      const db = createKnex(cluster.url.replace(/\/postgres$/, `/${database}`), 2);
      await migrateUntil(db, variant.until);
      const accounts = await createAccounts(db);
      if (variant.alerts) {
        for (const account of accounts) await setAlertSettings(db, account.id, THRESHOLDS_UNITS, DECISION_RESERVE_UNITS_PER_QUESTION);
      }
      const { rows } = await db.raw<{ rows: Array<{ proname: string }> }>("SELECT proname FROM pg_proc WHERE proname LIKE 'metering%'");
      await db.destroy();
      schemas.push({
        name: variant.name,
        database,
        keyHashes: accounts.map((a) => a.keyHash.toString("hex")),
        accountIds: accounts.map((a) => a.id),
        statements: statementsOf(new Set(rows.map((row) => row.proname))),
      });
    }
    runAsClusterOwner(path.join(bin, "pg_ctl"), ["-D", cluster.dir, "-m", "fast", "-w", "stop"]);

    const instructions = (schema: Schema, pairs: number, kind: Kind): number => callgrindInstructions(bin, cluster.dir, schema.database, pairScript(schema, pairs, kind));
    const perPair = (schema: Schema, kind: Kind) => (instructions(schema, MANY, kind) - instructions(schema, FEW, kind)) / (MANY - FEW);

    console.log(`sql instructions bench: PostgreSQL ${path.basename(path.dirname(bin))}, single-user backend, ${MANY - FEW} pairs over ${ACCOUNTS} accounts`);
    const latest = schemas.find((schema) => schema.name === "latest")!;
    const bare = perPair(latest, "bare");
    const row = (label: string, value: number, versus: string) =>
      console.log(`${label.padEnd(72)} | ${(value / 1000).toFixed(0).padStart(19)} | ${(value / bare).toFixed(2).padStart(13)} | ${versus}`);
    console.log(`${"path".padEnd(72)} | k instructions/pair | ratio to bare | ratio to latest`);
    row("bare UPDATE … RETURNING (one statement), latest", bare, "");
    for (const kind of ["metered", "batched"] as const) {
      const latestPair = perPair(latest, kind);
      for (const schema of schemas) {
        const label = `${kind === "metered" ? "admit + settle" : `admit + settle in batches of ${BATCH}`}, ${schema.name}`;
        if (!NEEDS[kind].every((name) => schema.statements[name])) {
          console.log(`${label.padEnd(72)} | ${"—".padStart(19)} | (this schema has no such function)`);
          continue;
        }
        const pair = schema === latest ? latestPair : perPair(schema, kind);
        row(label, pair, (pair / latestPair).toFixed(3));
      }
    }
  } finally {
    fs.rmSync(cluster.dir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});
