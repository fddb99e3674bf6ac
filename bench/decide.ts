/**
 * Decide through the JSON gateway against a fake OpenAI-compatible upstream
 * that answers every question after 50 ms, with a bare `node:http` server
 * answering the same fixed JSON measured in the same run as the baseline.
 *
 *   npm run bench:decide                          # embedded store in a temp folder
 *   DATABASE_URL=postgres://… npm run bench:decide  # a scratch database on that server
 *   BENCH_DURATION_S=5 BENCH_CONNECTIONS=50 npm run bench:decide
 *
 * Prints req/s, p50/p99 and ratios:
 *   - throughput of 1-question decisions against the bare server, with the
 *     50 ms upstream and with an upstream answering at once (our own overhead);
 *   - latency of 40 questions against 1 question (target: docs/performance.md),
 *     measured one request at a time so the ratio is the engine's fan-out.
 * Loopback only; every measure is bounded in time. Each connection uses its
 * own account, with limits far above the product's (60/min, 5 in flight),
 * which would otherwise cap the load at one call per second. The load
 * generator and the service share this process, the fake upstream runs in
 * its own; `npm run bench` measures the service in its own process.
 */
import { startApp } from "../src/app.js";
import { loadConfig } from "../src/config.js";
import { createLogger } from "../src/logger.js";
import { startFakeUpstream } from "./processes.js";
import { createBenchAccounts, decideBody, openBenchStore, printTable, runAutocannon, startBareBaseline } from "./support.js";

const DURATION_S = Number(process.env.BENCH_DURATION_S ?? 5);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 50);
/** 40 questions × this many connections upstream calls in flight on the fake. */
const FORTY_CONNECTIONS = 10;
const UPSTREAM_DELAY_MS = 50;

async function main() {
  // The fake upstream runs in a process of its own, as a real upstream would: it must not take CPU from the service.
  const fake = await startFakeUpstream();
  await fake.setDelay(UPSTREAM_DELAY_MS);
  const store = await openBenchStore(process.env.DATABASE_URL);
  const config = loadConfig({
    PORT: "0",
    TYPESAFE_LOG_LEVEL: "silent",
    TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
    TYPESAFE_LLM_MAX_CONCURRENT_CALLS: "512",
    ...store.env,
  });
  const app = await startApp(config, createLogger("silent"));
  const { db } = app.database;
  const apiKeys = (await createBenchAccounts(db, CONNECTIONS, 10_000)).map((a) => a.apiKey);
  const apiKey = apiKeys[0]!;

  const decideUrl = `${app.server.url}/api/v1/decisions`;
  const headers = { "content-type": "application/json", authorization: `Bearer ${apiKey}` };
  const warm = await fetch(decideUrl, { method: "POST", headers, body: decideBody(1) });
  const fixed = await warm.text();
  if (warm.status !== 200) throw new Error(`warm-up decide answered ${warm.status}: ${fixed}`);

  const bare = await startBareBaseline(fixed);

  const run = async (url: string, body: string, connections: number) => {
    let next = 0;
    return runAutocannon({
      url,
      method: "POST",
      headers,
      body,
      connections,
      duration: DURATION_S,
      // One account per connection, as callers are: one hot account row would measure lock waits, not the service.
      setupClient: (client) => client.setHeaders({ ...headers, authorization: `Bearer ${apiKeys[next++ % apiKeys.length]}` }),
    });
  };

  try {
    console.log(
      `decide bench: upstream answers after ${UPSTREAM_DELAY_MS} ms, ${DURATION_S} s per measure, ` +
        `${app.database.kind} store, Node ${process.version}`,
    );
    const baseline = await run(bare.url, decideBody(1), CONNECTIONS);
    const one = await run(decideUrl, decideBody(1), CONNECTIONS);
    const oneSerial = await run(decideUrl, decideBody(1), 1);
    const fortySerial = await run(decideUrl, decideBody(40), 1);
    const forty = await run(decideUrl, decideBody(40), FORTY_CONNECTIONS);
    await fake.setDelay(0);
    const oneInstant = await run(decideUrl, decideBody(1), CONNECTIONS);

    const row = printTable(44, 7);
    row(`bare node:http, fixed JSON (${CONNECTIONS} conn)`, baseline, "1.00 (throughput baseline)");
    row(`decide, 1 question (${CONNECTIONS} conn)`, one, `${(one.requests.average / baseline.requests.average).toFixed(3)} of bare req/s`);
    row(
      `decide, 1 question, 0 ms upstream (${CONNECTIONS} conn)`,
      oneInstant,
      `${(oneInstant.requests.average / baseline.requests.average).toFixed(3)} of bare req/s`,
    );
    row(`decide, 40 questions (${FORTY_CONNECTIONS} conn)`, forty, `${(forty.requests.average / one.requests.average).toFixed(2)} of 1-question req/s`);
    row("decide, 1 question (1 conn)", oneSerial, "1.00 (latency baseline)");
    const latencyRatio = fortySerial.latency.average / oneSerial.latency.average;
    const verdict = latencyRatio <= 1.3 ? "within" : "ABOVE";
    row("decide, 40 questions (1 conn)", fortySerial, `${latencyRatio.toFixed(2)}× the 1-question mean latency (${verdict} the 1.3 target)`);
  } finally {
    await bare.close();
    await app.stop();
    await fake.close();
    await store.cleanup();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
