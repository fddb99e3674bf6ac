/**
 * What the embedded store's wire server adds to a query: CPU per query of a
 * `pg` client through serveWire, against PGlite's own query() on the same
 * database in the same run (the baseline), alternated in batches so the
 * machine's drift falls on both. The statements are the extended protocol's
 * (Parse/Bind/Describe/Execute/Sync), as the service's are.
 *
 *   npm run bench:embedded-wire
 */
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { PGlite } from "@electric-sql/pglite";
import pg from "pg";
import { serveWire } from "../src/db/pglite-wire.js";
import { alternatedCpuMicros } from "./support.js";

const BATCH = 300;
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 20);
const SQL = "SELECT $1::int AS n";

async function main() {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-wire-bench-"));
  const db = await PGlite.create(dataDir);
  const wire = await serveWire(db);
  const client = new pg.Client({ connectionString: wire.url });
  await client.connect();
  try {
    const queries = (run: (i: number) => Promise<unknown>) => async () => {
      for (let i = 0; i < BATCH; i++) await run(i);
    };
    const paths = {
      "PGlite query() (baseline)": queries((i) => db.query(SQL, [i])),
      "pg through the wire": queries((i) => client.query({ text: SQL, values: [i] })),
    };
    const cpuMicros = await alternatedCpuMicros(paths, ROUNDS);
    const perQuery = (name: string) => cpuMicros.get(name)! / (ROUNDS * BATCH);
    const baseline = perQuery("PGlite query() (baseline)");
    console.log(`embedded wire bench: ${os.cpus().length} cores, Node ${process.version}, ${ROUNDS} alternated batches of ${BATCH} queries`);
    for (const name of Object.keys(paths)) {
      console.log(`${name.padEnd(26)} ${perQuery(name).toFixed(0).padStart(5)} µs CPU per query  ${(perQuery(name) / baseline).toFixed(2)}×`);
    }
  } finally {
    await client.end();
    await wire.close();
    await db.close();
    await fs.rm(dataDir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
