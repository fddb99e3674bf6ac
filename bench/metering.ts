/**
 * Admit+settle pairs per second through the service's metering wrapper
 * (meter.run: key check, rate, concurrency, funding, hold, then settle, with
 * the ledger rows) against the same two SQL functions issued bare on a pg
 * pool, and a bare `UPDATE … RETURNING` on the balance, all in the same run.
 * Over 1 hot account and over 200 accounts. Prints pairs/s, p50/p99 and ratios.
 *
 *   npm run bench:metering                      # local PostgreSQL (127.0.0.1:5432), a scratch database
 *   DATABASE_URL=postgres://… npm run bench:metering
 *   BENCH_WORKERS=1 npm run bench:metering      # one pair at a time: what each path adds to a call's latency
 *
 * Bench accounts get rate and concurrency limits far above the product's
 * (60/min, 5 in flight), which would otherwise cap one account at 1 call/s,
 * and a 50 ms rate window, so their admission log stays near the product's
 * size (at most 60 entries) instead of growing with the load.
 */
import crypto from "node:crypto";
import pg from "pg";
import { hashApiKey } from "../src/keys/api-keys.js";
import { loadConfig } from "../src/config.js";
import { createKnex, migrate } from "../src/db/database.js";
import { createLogger } from "../src/logger.js";
import { createMeter, decisionReserveUnits } from "../src/metering/meter.js";
import { createBenchAccounts, createScratchDatabase, median } from "./support.js";

const WORKERS = Number(process.env.BENCH_WORKERS ?? 10);
const DURATION_MS = Number(process.env.BENCH_DURATION_MS ?? 4_000);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);

interface Figures {
  pairsPerSecond: number;
  p50Ms: number;
  p99Ms: number;
}

/** Runs `op` from WORKERS loops for DURATION_MS; the i-th call gets i. */
async function measure(op: (i: number) => Promise<void>): Promise<Figures> {
  const latencies: number[] = [];
  let next = 0;
  const end = performance.now() + DURATION_MS;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: WORKERS }, async () => {
      while (performance.now() < end) {
        const t = performance.now();
        await op(next++);
        latencies.push(performance.now() - t);
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  latencies.sort((a, b) => a - b);
  const at = (q: number) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] ?? NaN;
  return { pairsPerSecond: latencies.length / seconds, p50Ms: at(0.5), p99Ms: at(0.99) };
}

async function main() {
  const scratch = await createScratchDatabase(process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres");
  const db = createKnex(scratch.url, Math.max(WORKERS, 2)); // migrating takes a second connection for its lock
  const pool = new pg.Pool({ connectionString: scratch.url, max: WORKERS });
  try {
    await migrate(db, { useAdvisoryLock: true });
    const meter = createMeter({ db, config: loadConfig({}).metering, logger: createLogger("silent") });

    const makeAccounts = async (count: number) =>
      (await createBenchAccounts(db, count, 1_000)).map((a) => ({ ...a, keyHash: hashApiKey(a.apiKey) }));
    const reserve = decisionReserveUnits(1);
    const signal = new AbortController().signal;

    console.log(`metering bench: ${WORKERS} workers, ${DURATION_MS} ms per measure, median of ${ROUNDS} rounds`);
    console.log("accounts | path                                     | pairs/s |  p50 ms |  p99 ms | ratio to bare SQL");
    for (const count of [1, 200]) {
      const accounts = await makeAccounts(count);
      const pick = (i: number) => accounts[i % accounts.length]!;
      const rounds: Record<string, Figures[]> = { update: [], bare: [], meter: [] };
      for (let r = 0; r < ROUNDS; r++) {
        rounds.update!.push(
          await measure(async (i) => {
            await pool.query("UPDATE accounts SET reserved = reserved WHERE id = $1 AND balance >= $2 RETURNING balance", [pick(i).id, reserve]);
          }),
        );
        rounds.bare!.push(
          await measure(async (i) => {
            // As the service sends it: with the call's own request id (which an abandon could name).
            const { rows } = await pool.query(
              "SELECT request_id FROM metering_admit_unless_abandoned_v2($1::bytea, 'decide', $2::bigint, false, 60000, NULL, NULL, NULL, $3::uuid)",
              [pick(i).keyHash, reserve, crypto.randomUUID()],
            );
            await pool.query("SELECT outcome FROM metering_resolve_v2($1::uuid, true, 1000)", [rows[0].request_id]);
          }),
        );
        rounds.meter!.push(
          await measure(async (i) => {
            await meter.run(
              { apiKey: pick(i).apiKey, requestId: crypto.randomUUID(), endpoint: "decide", reserveUnits: reserve, freeAllowed: false, timeoutMs: 60_000, signal },
              async () => ({ value: null, chargeUnits: 1_000 }),
            );
          }),
        );
      }
      const bare = median(rounds.bare!.map((f) => f.pairsPerSecond));
      const rows: [string, Figures[]][] = [
        ["bare UPDATE … RETURNING (one statement)", rounds.update!],
        ["bare admit + settle (two statements)", rounds.bare!],
        ["meter.run admit + settle (the service)", rounds.meter!],
      ];
      for (const [name, figures] of rows) {
        const rate = median(figures.map((f) => f.pairsPerSecond));
        console.log(
          `${String(count).padStart(8)} | ${name.padEnd(40)} | ${rate.toFixed(0).padStart(7)} | ${median(figures.map((f) => f.p50Ms)).toFixed(2).padStart(7)} | ${median(figures.map((f) => f.p99Ms)).toFixed(2).padStart(7)} | ${(rate / bare).toFixed(2)}`,
        );
      }
    }
  } finally {
    await pool.end();
    await db.destroy();
    await scratch.drop();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
