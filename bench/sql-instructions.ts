/**
 * Instructions a PostgreSQL backend executes per admit + settle pair, counted
 * by valgrind's callgrind. Unlike time, the count does not move with what else
 * the machine is doing, so a change to the metering functions or tables shows
 * even on a busy 2-core VM where pairs per second vary by a third between runs.
 *
 *   npm run bench:sql
 *   BENCH_SQL_BEFORE=20261125000000_refuse_abandoned_admissions npm run bench:sql   # also the schema as of that migration
 *
 * A throwaway cluster (Debian's server binaries, as the crash test uses) gets
 * one database per schema, migrated and given accounts; then the server stops
 * and each script of statements runs in single-user mode under callgrind,
 * once with 100 pairs and once with 300, so start-up and warm-up cancel out of
 * the difference. The statements are the service's (an admission through
 * metering_admit_unless_abandoned with its own request id, then the settle),
 * each its own transaction; and the same pairs as the meter batches them under
 * load (ten admissions in one statement, then their ten settles in one). The
 * count leaves out what a batch saves most (round trips, wake-ups, WAL
 * flushes: single-user mode has none). The same-run baseline is a bare
 * `UPDATE … RETURNING` on an account row, one statement per pair, as in
 * bench:metering. Prints thousands of instructions per pair and the ratio.
 */
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { hashApiKey } from "../src/accounts/api-keys.js";
import { createKnex } from "../src/db/database.js";
import { migrationSource } from "../src/db/migrations/index.js";
import { decisionReserveUnits } from "../src/metering/meter.js";
import { postgresBinaries, runAsClusterOwner, startPrivateCluster } from "../test/support/private-cluster.js";
import { createBenchAccounts } from "./support.js";

const BEFORE = process.env.BENCH_SQL_BEFORE;
const ACCOUNTS = 50;
const [FEW, MANY] = [100, 300];

interface Schema {
  name: string;
  database: string;
  keyHashes: string[];
  accountIds: string[];
}

/** Pairs per statement in the "batched" script: what the meter's batches hold under load. */
const BATCH = 10;

/** The statements of `pairs` pairs, one per line (single-user mode runs each line as its own transaction). */
function pairScript(schema: Schema, pairs: number, kind: "bare" | "metered" | "batched"): string {
  if (kind === "batched") return batchedPairScript(schema, pairs);
  const lines: string[] = [];
  for (let i = 0; i < pairs; i++) {
    const account = i % ACCOUNTS;
    if (kind === "bare") {
      lines.push(`UPDATE accounts SET reserved = reserved WHERE id = '${schema.accountIds[account]}' AND balance >= 1 RETURNING balance`);
      continue;
    }
    const id = crypto.randomUUID();
    lines.push(
      "SELECT admission.* FROM set_config('synchronous_commit', 'off', true) AS relaxed, " +
        `metering_admit_unless_abandoned('\\x${schema.keyHashes[account]}'::bytea, 'decide', ${decisionReserveUnits(1)}, false, 60000, NULL, NULL, NULL, '${id}'::uuid) AS admission`,
      `SELECT * FROM metering_resolve('${id}'::uuid, true, 1000)`,
    );
  }
  return lines.join("\n") + "\n";
}

/** The same pairs as the meter sends them under load: BATCH admissions in one statement, then their BATCH settles in one. */
function batchedPairScript(schema: Schema, pairs: number): string {
  const lines: string[] = [];
  const array = (values: string[], type: string) => `ARRAY[${values.join(", ")}]::${type}[]`;
  for (let first = 0; first < pairs; first += BATCH) {
    const accounts = Array.from({ length: BATCH }, (_, i) => (first + i) % ACCOUNTS);
    const ids = accounts.map(() => `'${crypto.randomUUID()}'`);
    const each = (value: string) => accounts.map(() => value);
    lines.push(
      "SELECT admission.* FROM set_config('synchronous_commit', 'off', true) AS relaxed, metering_admit_many(" +
        [
          array(accounts.map((account) => `'\\x${schema.keyHashes[account]}'`), "bytea"),
          array(each("'decide'"), "text"),
          array(each(String(decisionReserveUnits(1))), "bigint"),
          array(each("false"), "boolean"),
          array(each("60000"), "integer"),
          array(each("NULL"), "text"),
          array(each("NULL"), "bytea"),
          array(each("NULL"), "timestamptz"),
          array(ids, "uuid"),
        ].join(", ") +
        ") AS admission",
      `SELECT * FROM metering_resolve_many(${[array(ids, "uuid"), array(each("true"), "boolean"), array(each("1000"), "bigint"), array(each("NULL"), "jsonb"), array(each("NULL"), "timestamptz")].join(", ")})`,
    );
  }
  return lines.join("\n") + "\n";
}

async function main() {
  const bin = postgresBinaries();
  if (!bin) throw new Error("no PostgreSQL server binaries under /usr/lib/postgresql (Debian's postgresql package)");
  const cluster = await startPrivateCluster();
  try {
    const all = [...(await migrationSource.getMigrations([]))].sort();
    const latest = all.at(-1)!;
    if (BEFORE && !all.includes(BEFORE)) throw new Error(`BENCH_SQL_BEFORE: no migration ${BEFORE}; one of ${all.join(", ")}`);
    const schemas: Schema[] = [];
    for (const until of BEFORE ? [BEFORE, latest] : [latest]) {
      const database = `schema_${schemas.length}`;
      const admin = createKnex(cluster.url, 1);
      await admin.raw(`CREATE DATABASE ${database}`);
      await admin.destroy();
      const db = createKnex(cluster.url.replace(/\/postgres$/, `/${database}`), 2);
      const applied = all.filter((name) => name <= until);
      await db.migrate.latest({
        migrationSource: { ...migrationSource, getMigrations: async () => applied },
      });
      const accounts = await createBenchAccounts(db, ACCOUNTS, 1_000);
      await db.destroy();
      schemas.push({
        name: until === latest ? "latest" : `as of ${until}`,
        database,
        keyHashes: accounts.map((a) => hashApiKey(a.apiKey).toString("hex")),
        accountIds: accounts.map((a) => a.id),
      });
    }
    runAsClusterOwner(path.join(bin, "pg_ctl"), ["-D", cluster.dir, "-m", "fast", "-w", "stop"]);

    const instructions = (schema: Schema, pairs: number, kind: "bare" | "metered" | "batched"): number => {
      // valgrind reports on stderr: "==pid== Collected : <instructions>".
      const report = runAsClusterOwner(
        "valgrind",
        ["--tool=callgrind", "--callgrind-out-file=/dev/null", path.join(bin, "postgres"), "--single", "-D", cluster.dir, "-c", "fsync=off", schema.database],
        pairScript(schema, pairs, kind),
      );
      // Single-user mode reports a failed statement and goes on: a count of errors would measure nothing.
      const failed = /ERROR: .*/.exec(report);
      if (failed) throw new Error(`a ${kind} statement failed: ${failed[0]}`);
      const collected = /Collected : (\d+)/.exec(report);
      if (!collected) throw new Error(`callgrind printed no count:\n${report}`);
      return Number(collected[1]);
    };
    const perPair = (schema: Schema, kind: "bare" | "metered" | "batched") =>
      (instructions(schema, MANY, kind) - instructions(schema, FEW, kind)) / (MANY - FEW);

    console.log(`sql instructions bench: PostgreSQL ${path.basename(path.dirname(bin))}, single-user backend, ${MANY - FEW} pairs over ${ACCOUNTS} accounts`);
    const newest = schemas.at(-1)!;
    const bare = perPair(newest, "bare");
    console.log(`${"path".padEnd(72)} | k instructions/pair | ratio to bare`);
    console.log(`${"bare UPDATE … RETURNING (one statement)".padEnd(72)} | ${(bare / 1000).toFixed(0).padStart(19)} | 1.00`);
    for (const schema of schemas) {
      const pair = perPair(schema, "metered");
      console.log(`${`admit + settle, schema ${schema.name}`.padEnd(72)} | ${(pair / 1000).toFixed(0).padStart(19)} | ${(pair / bare).toFixed(2)}`);
    }
    const batched = perPair(newest, "batched");
    console.log(`${`admit + settle in batches of ${BATCH}, schema ${newest.name}`.padEnd(72)} | ${(batched / 1000).toFixed(0).padStart(19)} | ${(batched / bare).toFixed(2)}`);
  } finally {
    fs.rmSync(cluster.dir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});
