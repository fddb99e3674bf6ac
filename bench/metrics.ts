/**
 * What the metrics cost on the hot path: 1-question decisions through the
 * JSON gateway against a fake upstream answering at once (in its own process),
 * with TYPESAFE_METRICS on and off, alternated (on, off, on, off, …) so drift
 * of a shared machine falls on both. The issue asks for ≤ 5 % difference.
 *
 *   npm run bench:metrics
 *   DATABASE_URL=postgres://… BENCH_ROUNDS=3 BENCH_DURATION_S=5 npm run bench:metrics
 */
import { fork } from "node:child_process";
import { fileURLToPath } from "node:url";
import { startApp } from "../src/app.js";
import { loadConfig } from "../src/config.js";
import { createLogger } from "../src/logger.js";
import { createBenchAccounts, openBenchStore, runAutocannon } from "./support.js";

const DURATION_S = Number(process.env.BENCH_DURATION_S ?? 5);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 50);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);

const body = JSON.stringify({
  model: "typesafe/service-1.13",
  state: { ticket: "I was charged twice for my pro plan this month" },
  questions: { urgent: { type: "noul", instructions: "Is it urgent?" } },
});

/** bench/decide.ts's fake upstream, in a child process, set to answer at once. */
async function startFakeUpstream() {
  const child = fork(fileURLToPath(new URL("./decide.ts", import.meta.url)), ["--fake-upstream"], { stdio: "inherit" });
  const next = () => new Promise<{ url?: string }>((resolve) => child.once("message", resolve));
  const { url } = await next();
  const send = async (message: object) => {
    const ack = next();
    child.send(message);
    await ack;
  };
  await send({ delayMs: 0 });
  return { url: url!, close: () => send({ stop: true }) };
}

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;

async function main() {
  const fake = await startFakeUpstream();
  const store = await openBenchStore(process.env.DATABASE_URL);
  let apiKeys: string[] | undefined;
  const rates: Record<"on" | "off", number[]> = { on: [], off: [] };
  try {
    console.log(`metrics cost bench: ${ROUNDS} rounds of on/off, ${DURATION_S} s each, ${CONNECTIONS} connections, Node ${process.version}`);
    for (let round = 0; round < ROUNDS; round++) {
      for (const setting of ["on", "off"] as const) {
        const config = loadConfig({
          PORT: "0",
          TYPESAFE_LOG_LEVEL: "silent",
          TYPESAFE_METRICS: setting,
          TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
          TYPESAFE_LLM_MAX_CONCURRENT_CALLS: "512",
          ...store.env,
        });
        const app = await startApp(config, createLogger("silent"));
        try {
          apiKeys ??= (await createBenchAccounts(app.database.db, CONNECTIONS, 10_000)).map((a) => a.apiKey);
          const keys = apiKeys;
          const url = `${app.server.url}/api/v1/decisions`;
          const headers = { "content-type": "application/json", authorization: `Bearer ${keys[0]}` };
          let next = 0;
          const result = await runAutocannon({
            url,
            method: "POST",
            headers,
            body,
            connections: CONNECTIONS,
            duration: DURATION_S,
            setupClient: (client) => client.setHeaders({ ...headers, authorization: `Bearer ${keys[next++ % keys.length]}` }),
          });
          rates[setting].push(result.requests.average);
          console.log(`  round ${round + 1} metrics ${setting.padEnd(3)} ${result.requests.average.toFixed(0).padStart(6)} req/s  p50 ${result.latency.p50} ms  p99 ${result.latency.p99} ms`);
        } finally {
          await app.stop();
        }
      }
    }
    const on = median(rates.on);
    const off = median(rates.off);
    const cost = (1 - on / off) * 100;
    console.log(`median req/s: metrics on ${on.toFixed(0)}, off ${off.toFixed(0)}; on/off ${(on / off).toFixed(3)} (${cost.toFixed(1)} % cost; target ≤ 5 %)`);
  } finally {
    await fake.close();
    await store.cleanup();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
