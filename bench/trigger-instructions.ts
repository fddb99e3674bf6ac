/**
 * What the row triggers of the money path cost, in instructions a PostgreSQL
 * backend executes per admit + settle pair (the service's own statements,
 * prepared), counted by valgrind's callgrind as `bench:sql` counts: a
 * throwaway cluster, every migration applied, then each script run in
 * single-user mode with 100 and with 300 pairs, so start-up cancels out of
 * the difference.
 *
 *   npm run bench:triggers
 *
 * The same schema three times: with every trigger, without the key budget
 * trigger (api_keys_budget_events), and without the two balance alerts
 * triggers (accounts_balance_alerts_on_*); each with keys without a budget,
 * and keys with a budget that stays far from reached (the settle then
 * charges the key).
 * Prints thousands of instructions per pair, and the ratio to the schema
 * with every trigger.
 */
import fs from "node:fs";
import path from "node:path";
import { hashApiKey } from "../src/keys/api-keys.js";
import { createKnex } from "../src/db/database.js";
import { migrate } from "../src/db/migrator.js";
import { meteringStatements } from "../src/metering/ledger.js";
import { postgresBinaries, runAsClusterOwner, startPrivateCluster } from "../test/support/private-cluster.js";
import { callgrindInstructions, meteredPairScript } from "./callgrind.js";
import { createBenchAccounts } from "./support.js";

const ACCOUNTS = 20;
const [FEW, MANY] = [100, 300];
const VARIANTS = [
  { name: "every trigger", drop: undefined },
  { name: "without the key budget trigger", drop: ["api_keys_budget_events ON api_keys"] },
  { name: "without the balance alerts triggers", drop: ["accounts_balance_alerts_on_balance ON accounts", "accounts_balance_alerts_on_settings ON accounts"] },
] as const;
type KeyKind = "without a budget" | "with a budget";

/** The service's own statement texts, prepared as it prepares them. */
const TEXTS = { admit: meteringStatements.admit.text, finish: meteringStatements.finish.text };

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

    const instructions = (database: string, keyHashes: string[], pairs: number): number =>
      callgrindInstructions(bin, cluster.dir, database, meteredPairScript(TEXTS, keyHashes, pairs));

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
