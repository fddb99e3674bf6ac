/**
 * What the metrics cost on the hot path: 1-question decisions through the
 * JSON gateway, the service in its own process (`node dist/bundle/main.mjs`) with
 * TYPESAFE_METRICS on and off, alternated (on, off, on, off, …) so drift of a
 * shared machine falls on both; the fake upstream (answering at once) and the
 * load generator in processes of their own. Prints throughput and the
 * service's CPU time per call, medians of the rounds (target:
 * docs/performance.md).
 *
 *   npm run bench:metrics
 *   DATABASE_URL=postgres://… BENCH_ROUNDS=5 BENCH_DURATION_S=5 npm run bench:metrics
 */
import { createKnex } from "../src/db/database.js";
import { buildService, startFakeUpstream, startLoadGenerator, startService } from "./processes.js";
import { createDefaultAccounts, createScratchDatabase, median } from "./support.js";

const DURATION_S = Number(process.env.BENCH_DURATION_S ?? 5);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 50);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const ACCOUNTS = 1_500;

const body = JSON.stringify({
  model: "typesafe/service-1.13",
  state: { ticket: "I was charged twice for my pro plan this month" },
  questions: { urgent: { type: "noul", instructions: "Is it urgent?" } },
});

async function main() {
  await buildService();
  const scratch = await createScratchDatabase(process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres");
  const fake = await startFakeUpstream();
  const load = await startLoadGenerator();
  const figures: Record<"on" | "off", { rps: number[]; cpuMsPerCall: number[] }> = { on: { rps: [], cpuMsPerCall: [] }, off: { rps: [], cpuMsPerCall: [] } };
  let apiKeys: string[] | undefined;
  try {
    console.log(`metrics cost bench: ${ROUNDS} rounds of on/off, ${DURATION_S} s each, ${CONNECTIONS} connections, Node ${process.version}`);
    for (let round = 0; round < ROUNDS; round++) {
      for (const setting of ["on", "off"] as const) {
        const service = await startService({ TYPESAFE_METRICS: setting, TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, DATABASE_URL: scratch.url });
        try {
          if (!apiKeys) {
            // The first start migrated the database.
            const db = createKnex(scratch.url, 4);
            apiKeys = await createDefaultAccounts(db, ACCOUNTS);
            await db.destroy();
          }
          const url = `${service.url}/api/v1/decisions`;
          await load.run({ mode: "http", url, body, apiKeys, connections: CONNECTIONS, durationS: 1 }); // warm-up
          const cpuBefore = await service.cpuSeconds();
          const result = await load.run({ mode: "http", url, body, apiKeys, connections: CONNECTIONS, durationS: DURATION_S });
          const cpuMsPerCall = ((await service.cpuSeconds()) - cpuBefore) * 1000 / result.requests;
          figures[setting].rps.push(result.rps);
          figures[setting].cpuMsPerCall.push(cpuMsPerCall);
          console.log(
            `  round ${round + 1} metrics ${setting.padEnd(3)} ${result.rps.toFixed(0).padStart(6)} req/s  p50 ${result.p50} ms  p99 ${result.p99} ms  ` +
              `service CPU ${cpuMsPerCall.toFixed(3)} ms/call`,
          );
        } finally {
          await service.stop();
        }
      }
    }
    const on = median(figures.on.rps);
    const off = median(figures.off.rps);
    const cpuOn = median(figures.on.cpuMsPerCall);
    const cpuOff = median(figures.off.cpuMsPerCall);
    console.log(
      `median: metrics on ${on.toFixed(0)} req/s, off ${off.toFixed(0)} req/s, on/off ${(on / off).toFixed(3)} ` +
        `(${((1 - on / off) * 100).toFixed(1)} % cost; target ≤ 5 %); service CPU per call on ${cpuOn.toFixed(3)} ms, off ${cpuOff.toFixed(3)} ms ` +
        `(${((cpuOn / cpuOff - 1) * 100).toFixed(1)} %)`,
    );
  } finally {
    await load.close();
    await fake.close();
    await scratch.drop();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
