/**
 * What the row triggers of the money path cost, in instructions a PostgreSQL
 * backend executes per admit + settle pair (metering_admit_unless_abandoned_v2,
 * then metering_resolve_v2), counted by valgrind's callgrind as
 * `bench:sql` counts: a throwaway cluster, every migration applied, then each
 * script run in single-user mode with 100 and with 300 pairs, so start-up
 * cancels out of the difference.
 *
 *   npm run bench:triggers
 *
 * The same schema three times: with every trigger, without the key budget
 * trigger (api_keys_budget_events), and without the two balance alerts
 * triggers (accounts_balance_alerts_on_*); each with keys without a budget, and keys with
 * a budget that stays far from reached (the settle then charges the key).
 * Prints thousands of instructions per pair, and the ratio to the schema
 * with every trigger.
 */
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { hashApiKey } from "../src/accounts/api-keys.js";
import { createKnex } from "../src/db/database.js";
import { migrate } from "../src/db/migrator.js";
import { decisionReserveUnits } from "../src/metering/meter.js";
import { postgresBinaries, runAsClusterOwner, startPrivateCluster } from "../test/support/private-cluster.js";
import { createBenchAccounts } from "./support.js";

const ACCOUNTS = 20;
const [FEW, MANY] = [100, 300];
const VARIANTS = [
  { name: "every trigger", drop: undefined },
  { name: "without the key budget trigger", drop: ["api_keys_budget_events ON api_keys"] },
  { name: "without the balance alerts triggers", drop: ["accounts_balance_alerts_on_balance ON accounts", "accounts_balance_alerts_on_settings ON accounts"] },
] as const;
type KeyKind = "without a budget" | "with a budget";

/** `pairs` admit + settle pairs over the keys in turn, one statement a line (each its own transaction). */
function pairScript(keyHashes: string[], pairs: number): string {
  const lines: string[] = [];
  for (let i = 0; i < pairs; i++) {
    const id = crypto.randomUUID();
    lines.push(
      `SELECT a.* FROM metering_admit_unless_abandoned_v2('\\x${keyHashes[i % keyHashes.length]}'::bytea, 'decide', ${decisionReserveUnits(1)}, false, 60000, NULL, NULL, NULL, '${id}'::uuid) AS a`,
      `SELECT * FROM metering_resolve_v2('${id}'::uuid, true, 1000)`,
    );
  }
  return lines.join("\n") + "\n";
}

async function main() {
  const bin = postgresBinaries();
  if (!bin) throw new Error("no PostgreSQL server binaries under /usr/lib/postgresql (Debian's postgresql package)");
  const cluster = await startPrivateCluster();
  try {
    const databases: Array<{ variant: string; database: string; keys: Record<KeyKind, string[]> }> = [];
    for (const [i, variant] of VARIANTS.entries()) {
      const database = `variant_${i}`;
      const admin = createKnex(cluster.url, 1);
      await admin.raw(`CREATE DATABASE ${database}`);
      await admin.destroy();
      const db = createKnex(cluster.url.replace(/\/postgres$/, `/${database}`), 2);
      await migrate(db, { useAdvisoryLock: false });
      const plain = await createBenchAccounts(db, ACCOUNTS, 1_000);
      const budgeted = await createBenchAccounts(db, ACCOUNTS, 1_000);
      await db("api_keys").whereIn("account_id", budgeted.map((a) => a.id)).update({ budget_units: 1e14, budget_period: "total" });
      for (const trigger of variant.drop ?? []) await db.raw(`DROP TRIGGER ${trigger}`);
      await db.destroy();
      const hashes = (accounts: Array<{ apiKey: string }>) => accounts.map((a) => hashApiKey(a.apiKey).toString("hex"));
      databases.push({ variant: variant.name, database, keys: { "without a budget": hashes(plain), "with a budget": hashes(budgeted) } });
    }
    runAsClusterOwner(path.join(bin, "pg_ctl"), ["-D", cluster.dir, "-m", "fast", "-w", "stop"]);

    const instructions = (database: string, keyHashes: string[], pairs: number): number => {
      const report = runAsClusterOwner(
        "valgrind",
        ["--tool=callgrind", "--callgrind-out-file=/dev/null", path.join(bin, "postgres"), "--single", "-D", cluster.dir, "-c", "fsync=off", database],
        pairScript(keyHashes, pairs),
      );
      const failed = /ERROR: .*/.exec(report);
      if (failed) throw new Error(`a statement failed: ${failed[0]}`);
      const collected = /Collected : (\d+)/.exec(report);
      if (!collected) throw new Error(`callgrind printed no count:\n${report}`);
      return Number(collected[1]);
    };

    console.log(`trigger instructions bench: PostgreSQL ${path.basename(path.dirname(bin))}, single-user backend, ${MANY - FEW} pairs over ${ACCOUNTS} accounts`);
    console.log(`${"keys".padEnd(18)} | ${"schema".padEnd(36)} | k instructions/pair | ratio to every trigger`);
    for (const kind of ["without a budget", "with a budget"] as const) {
      let reference: number | undefined;
      for (const { variant, database, keys } of databases) {
        const perPair = (instructions(database, keys[kind], MANY) - instructions(database, keys[kind], FEW)) / (MANY - FEW);
        reference ??= perPair;
        console.log(`${kind.padEnd(18)} | ${variant.padEnd(36)} | ${(perPair / 1000).toFixed(1).padStart(19)} | ${(perPair / reference).toFixed(3)}`);
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
