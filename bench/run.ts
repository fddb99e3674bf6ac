/**
 * `npm run bench`: the service as a user runs it (`node dist/bundle/main.mjs`, what
 * `npm start` runs, in its own process), the fake upstream, the bare
 * `node:http` baseline and the load generator each in a process of their own,
 * and one table: each figure, its baseline measured in this run, the ratio
 * and the target the service must meet.
 *
 *   npm run bench                                   # PostgreSQL at 127.0.0.1:5432 (scratch database), then the embedded store
 *   DATABASE_URL=postgres://… BENCH_DURATION_S=5 BENCH_INVALID_S=600 npm run bench
 *   BENCH_SERVICE_NODE_ARGS="--cpu-prof --cpu-prof-dir=prof" npm run bench   # a CPU profile of the service under all of it
 *   BENCH_ONLY=connection-cap npm run bench         # only the row of the connection cap
 *   BENCH_ONLY=embedded-model npm run bench         # only the row of the embedded model (the tiny test GGUF)
 *   BENCH_ONLY=rss npm run bench                    # only the two rows of peak RSS (the same loads as the full run)
 *
 * 1,500 accounts at the product's default limits take the load in turn (see
 * createDefaultAccounts). The upstream answers at once unless a row says
 * otherwise. Two more baselines give the floor under two targets on the
 * machine at hand: the bare chain (a call's hops with none of the service's
 * code: two row writes around the service's own upstream request) under the
 * throughput and latency rows, and a bare `node:http2` server answering as
 * gRPC, under the same generator as the gRPC row.
 */
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { createKnex } from "../src/db/database.js";
import { writeTinyGguf } from "../test/support/tiny-gguf.js";
import type { LoadResult } from "./roles.js";
import { buildService, startBareChain, startBareGrpcServer, startBareServer, startFakeUpstream, startLoadGenerator, startService, type ServiceProcess } from "./processes.js";
import {
  createDefaultAccounts,
  createScratchDatabase,
  decideBody,
  embeddedStoreUrl,
  keptAliveClient,
  median,
  openHalfHeads,
  probeNewConnection,
  promSample,
} from "./support.js";

const DURATION_S = Number(process.env.BENCH_DURATION_S ?? 5);
const CONNECTIONS = 50;
const ACCOUNTS = 1_500;
const STEADY_RATE = 500;
const STARTS = 3;
const INVALID_S = Number(process.env.BENCH_INVALID_S ?? 30);
/** Stalled half-open connections that, with the load's own, fill the connection cap in its row. */
const CAP_FILLERS = 1_000;
/** `connection-cap` runs only that row. */
const ONLY = process.env.BENCH_ONLY;
/** Node options for the service measured on PostgreSQL, e.g. `--cpu-prof --cpu-prof-dir=prof` to see where its time goes. */
const SERVICE_NODE_ARGS = (process.env.BENCH_SERVICE_NODE_ARGS ?? "").split(" ").filter(Boolean);

const fixed = (value: number, digits = 0) => value.toFixed(digits);
/** A difference in milliseconds with its sign. */
const signedMs = (value: number) => `${value < 0 ? "−" : "+"}${Math.abs(value).toFixed(2)}`;

interface Row {
  measure: string;
  figure: string;
  baseline: string;
  ratio: string;
  target: string;
  met: boolean;
}

function printRows(rows: Row[]): void {
  const columns: Array<keyof Omit<Row, "met">> = ["measure", "figure", "baseline", "ratio", "target"];
  const widths = columns.map((c) => Math.max(c.length, ...rows.map((r) => r[c].length)));
  const line = (cells: string[]) => `| ${cells.map((cell, i) => cell.padEnd(widths[i]!)).join(" | ")} |`;
  console.log(line([...columns]) + " met");
  console.log(line(widths.map((w) => "-".repeat(w))) + " ---");
  for (const row of rows) console.log(line(columns.map((c) => row[c])) + (row.met ? " yes" : " NO"));
}

/** Connections of the embedded model's row: a few callers keep its sequences busy without queueing for long. */
const EMBEDDED_CONNECTIONS = 4;

/**
 * Decisions on the embedded model, with no upstream: the tiny GGUF the tests
 * use (its speed is llama.cpp's per-token cost on a model of almost no
 * weights, so the row measures the service's path around the engine), one
 * thread, and the process's peak RSS with the model loaded.
 */
async function embeddedModelRow(env: Record<string, string>, load: Awaited<ReturnType<typeof startLoadGenerator>>, apiKeys: string[], dataDir: string, viaUpstream?: LoadResult): Promise<Row> {
  const modelPath = writeTinyGguf(path.join(dataDir, "tiny.gguf"));
  const service = await startService({ ...env, TYPESAFE_LLM_MODEL_PATH: modelPath, TYPESAFE_LLM_THREADS: "1", TYPESAFE_LLM_SEQUENCES: "2" });
  try {
    const deadline = performance.now() + 60_000;
    while (!JSON.stringify(await (await fetch(`${service.url}/healthz`)).json()).includes('"model_state":"ready"')) {
      if (performance.now() > deadline) throw new Error("the embedded model row: the model did not load within 60 s");
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    const decisions = `${service.url}/api/v1/decisions`;
    const measure = (body: string, durationS: number) => load.run({ mode: "http", url: decisions, body, apiKeys, connections: EMBEDDED_CONNECTIONS, durationS });
    await measure(decideBody(1), 2); // warm-up
    const one = await measure(decideBody(1), DURATION_S);
    const forty = await measure(decideBody(40), DURATION_S);
    const rssMb = await service.peakRssMb();
    return {
      measure: `decisions on the embedded model (tiny GGUF, 1 thread, 2 sequences, ${EMBEDDED_CONNECTIONS} callers)`,
      figure: `1 question: ${fixed(one.rps, 1)} calls/s (p50 ${fixed(one.p50, 1)} ms, p99 ${fixed(one.p99, 1)} ms); 40 questions: ${fixed(forty.rps, 2)} calls/s (p50 ${fixed(forty.p50)} ms, p99 ${fixed(forty.p99)} ms); peak RSS ${fixed(rssMb)} MB`,
      baseline: viaUpstream ? `the HTTP upstream path: ${fixed(viaUpstream.rps)} req/s` : "—",
      ratio: viaUpstream ? `${(one.rps / viaUpstream.rps).toFixed(3)}×` : "—",
      // The load generator fails the run on any non-2xx answer or error.
      target: "— (CPU-bound: see docs/decisions.md)",
      met: true,
    };
  } finally {
    await service.stop();
  }
}

/**
 * The answer rate with the connection cap reached. A service capped at one
 * kept-alive probe connection + CAP_FILLERS + the load's connections is
 * measured alone, then with the cap filled by stalled half-open connections
 * and the load generator's own pool; meanwhile one more connection must be
 * closed unanswered and /healthz answered on the probe's connection.
 */
async function connectionCapRow(env: Record<string, string>, load: Awaited<ReturnType<typeof startLoadGenerator>>, apiKeys: string[]): Promise<Row> {
  const cap = 1 + CAP_FILLERS + CONNECTIONS;
  // The fillers must stay: a real crowd would renew them as the head timeout closes them.
  const service = await startService({ ...env, TYPESAFE_MAX_CONNECTIONS: String(cap), TYPESAFE_HEADERS_TIMEOUT_MS: "600000" });
  const probe = keptAliveClient(service.url);
  let crowd: Awaited<ReturnType<typeof openHalfHeads>> | undefined;
  try {
    const decisions = `${service.url}/api/v1/decisions`;
    const measure = (durationS: number) => load.run({ mode: "http", url: decisions, body: decideBody(1), apiKeys, connections: CONNECTIONS, durationS });
    const openConnections = async () => promSample((await probe.get("/metrics")).body, "typesafe_connections_open");
    const until = async (wanted: number, what: string) => {
      const deadline = performance.now() + 15_000;
      while ((await openConnections()) !== wanted) {
        if (performance.now() > deadline) throw new Error(`the connection cap row: timed out waiting for ${what}`);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    };
    await measure(2); // warm-up
    const alone = await measure(DURATION_S);
    // Clients of earlier measures close their kept-alive connections; then only the probe's is open.
    await until(1, "the probe's connection alone");
    crowd = await openHalfHeads(service.url, CAP_FILLERS);
    const loaded = measure(DURATION_S);
    await until(cap, "the cap to be reached");
    const extra = await probeNewConnection(service.url);
    const health = await probe.get("/healthz");
    const atCap = await loaded;
    return {
      measure: `1-question decisions at the connection cap (${CAP_FILLERS} stalled connections + ${CONNECTIONS} callers)`,
      figure: `${fixed(atCap.rps)} req/s (p50 ${fixed(atCap.p50, 1)} ms, p99 ${fixed(atCap.p99, 1)} ms); one more connection ${extra.refused ? "closed unanswered" : "ANSWERED"} after ${fixed(extra.closedAfterMs, 1)} ms; /healthz on an open connection ${health.status}`,
      baseline: `the same service, no crowd: ${fixed(alone.rps)} req/s`,
      ratio: `${(atCap.rps / alone.rps).toFixed(2)}×`,
      target: "≥ 0.9×, the extra connection refused, /healthz 200",
      met: atCap.rps / alone.rps >= 0.9 && extra.refused && health.status === 200,
    };
  } finally {
    probe.close();
    crowd?.close();
    await service.stop();
  }
}

/**
 * Peak RSS of a service on PostgreSQL under the decision loads of the full
 * run (the gateway, gRPC frames, the steady rate), then after bad input.
 */
async function rssRows(service: ServiceProcess, load: Awaited<ReturnType<typeof startLoadGenerator>>, apiKeys: string[]): Promise<Row[]> {
  const one = decideBody(1);
  const decisions = `${service.url}/api/v1/decisions`;
  await load.run({ mode: "http", url: decisions, body: one, apiKeys, connections: CONNECTIONS, durationS: 2 });
  await load.run({ mode: "http", url: decisions, body: one, apiKeys, connections: CONNECTIONS, durationS: DURATION_S });
  await load.run({ mode: "grpc-frames", url: service.url, body: one, apiKeys, connections: CONNECTIONS, durationS: DURATION_S });
  await load.run({ mode: "grpc", url: service.url, body: one, apiKeys, connections: CONNECTIONS, durationS: DURATION_S });
  await load.run({ mode: "rate", url: decisions, body: one, apiKeys, connections: CONNECTIONS, durationS: DURATION_S, rate: STEADY_RATE });
  const underLoad = await service.peakRssMb();
  const invalid = await load.run({ mode: "invalid", url: service.url, body: "", apiKeys, connections: 20, durationS: INVALID_S });
  const afterInvalid = await service.peakRssMb();
  await service.stop();
  return [
    { measure: "peak RSS under the decision loads", figure: `${fixed(underLoad)} MB`, baseline: "—", ratio: "—", target: "≤ 200 MB", met: underLoad <= 200 },
    {
      measure: `peak RSS after ${INVALID_S} s of mixed invalid traffic`,
      figure: `${fixed(afterInvalid)} MB (${fixed(invalid.rps)} req/s, every answer a 4xx)`,
      baseline: "—",
      ratio: "—",
      target: "≤ 200 MB",
      met: afterInvalid <= 200,
    },
  ];
}

async function main() {
  const serverUrl = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
  console.log(`bench: ${os.cpus().length} cores, Node ${process.version}, ${DURATION_S} s per measure, ${CONNECTIONS} connections, ${new Date().toISOString()}`);
  await buildService();
  const scratch = await createScratchDatabase(serverUrl);
  const fake = await startFakeUpstream();
  const load = await startLoadGenerator();
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-bench-"));
  const serviceEnv = { TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_LLM_MODEL: "bench-model" };
  const rows: Row[] = [];
  let service: ServiceProcess | undefined;
  let bare: Awaited<ReturnType<typeof startBareServer>> | undefined;
  let chain: Awaited<ReturnType<typeof startBareChain>> | undefined;
  let bareGrpc: Awaited<ReturnType<typeof startBareGrpcServer>> | undefined;
  try {
    if (ONLY === "connection-cap") {
      // The first start migrates the scratch database; the row starts a service of its own.
      await (await startService({ ...serviceEnv, DATABASE_URL: scratch.url })).stop();
      const db = createKnex(scratch.url, 4);
      const apiKeys = await createDefaultAccounts(db, ACCOUNTS);
      await db.destroy();
      return printRows([await connectionCapRow({ ...serviceEnv, DATABASE_URL: scratch.url }, load, apiKeys)]);
    }
    if (ONLY === "embedded-model") {
      await (await startService({ ...serviceEnv, DATABASE_URL: scratch.url })).stop();
      const db = createKnex(scratch.url, 4);
      const apiKeys = await createDefaultAccounts(db, ACCOUNTS);
      await db.destroy();
      return printRows([await embeddedModelRow({ DATABASE_URL: scratch.url }, load, apiKeys, dataDir)]);
    }
    if (ONLY === "rss") {
      service = await startService({ ...serviceEnv, DATABASE_URL: scratch.url }, { nodeArgs: SERVICE_NODE_ARGS });
      const db = createKnex(scratch.url, 4);
      const apiKeys = await createDefaultAccounts(db, ACCOUNTS);
      await db.destroy();
      return printRows(await rssRows(service, load, apiKeys));
    }
    // Start-up as a user runs it (`npm start`, its build fresh): the first start migrates the fresh database,
    // the next ones are what a restart costs.
    const startTimes: number[] = [];
    for (let i = 0; i <= STARTS; i++) {
      service = await startService({ ...serviceEnv, DATABASE_URL: scratch.url }, { via: "npm" });
      if (i > 0) startTimes.push(service.startMs);
      await service.stop();
    }
    const onPostgres = (service = await startService({ ...serviceEnv, DATABASE_URL: scratch.url }, { nodeArgs: SERVICE_NODE_ARGS }));
    const db = createKnex(scratch.url, 4);
    const apiKeys = await createDefaultAccounts(db, ACCOUNTS);
    await db.destroy();

    const one = decideBody(1);
    const answer = await fetch(`${onPostgres.url}/api/v1/decisions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${apiKeys[0]}` },
      body: one,
    });
    const answerText = await answer.text();
    if (answer.status !== 200) throw new Error(`a warm-up decision answered ${answer.status}: ${answerText}`);
    bare = await startBareServer(answerText);
    // A message the size of the gateway's answer (its content is not read).
    bareGrpc = await startBareGrpcServer(answerText);
    const question = await fake.lastQuestion();
    chain = await startBareChain({ answer: answerText, upstreamUrl: question.url, upstreamBody: question.body, databaseUrl: scratch.url });
    const http = (url: string, body = one, connections = CONNECTIONS): Promise<LoadResult> =>
      load.run({ mode: "http", url, body, apiKeys, connections, durationS: DURATION_S });
    const decisions = `${onPostgres.url}/api/v1/decisions`;

    await load.run({ mode: "http", url: decisions, body: one, apiKeys, connections: CONNECTIONS, durationS: 2 }); // warm-up
    /** The service's CPU time per call during `measure`: what a call costs, whatever else the machine runs. */
    const withCpu = async (measure: () => Promise<LoadResult>) => {
      const before = await onPostgres.cpuSeconds();
      const result = await measure();
      return { ...result, cpuMs: ((await onPostgres.cpuSeconds()) - before) * 1000 / result.requests };
    };
    const bareLoad = await http(bare.url);
    const chainLoad = await http(chain.url);
    const bareGrpcLoad = await load.run({ mode: "grpc-frames", url: bareGrpc.url, body: one, apiKeys, connections: CONNECTIONS, durationS: DURATION_S });
    await bareGrpc.close();
    const sqlPairs = await load.run({ mode: "sql-pair", url: scratch.url, body: "", apiKeys, connections: CONNECTIONS, durationS: DURATION_S });
    const gateway = await withCpu(() => http(decisions));
    // gRPC measured like the gateway: a generator sending pre-built requests (as autocannon does), so the two
    // surfaces get the same share of the cores; a generated client, which costs its own process more per call, beside it.
    const grpc = await withCpu(() => load.run({ mode: "grpc-frames", url: onPostgres.url, body: one, apiKeys, connections: CONNECTIONS, durationS: DURATION_S }));
    const grpcClient = await withCpu(() => load.run({ mode: "grpc", url: onPostgres.url, body: one, apiKeys, connections: CONNECTIONS, durationS: DURATION_S }));
    const bareSteady = await load.run({ mode: "rate", url: bare.url, body: one, apiKeys, connections: CONNECTIONS, durationS: DURATION_S, rate: STEADY_RATE });
    const chainSteady = await load.run({ mode: "rate", url: chain.url, body: one, apiKeys, connections: CONNECTIONS, durationS: DURATION_S, rate: STEADY_RATE });
    await chain.close();
    const steady = await load.run({ mode: "rate", url: decisions, body: one, apiKeys, connections: CONNECTIONS, durationS: DURATION_S, rate: STEADY_RATE });
    const rssUnderLoad = await onPostgres.peakRssMb();
    const invalid = await load.run({ mode: "invalid", url: onPostgres.url, body: "", apiKeys, connections: 20, durationS: INVALID_S });
    const rssAfterInvalid = await onPostgres.peakRssMb();
    await fake.setDelay(50);
    const oneSerial = await http(decisions, one, 1);
    const fortySerial = await http(decisions, decideBody(40), 1);
    await fake.setDelay(0);
    await onPostgres.stop();
    const capRow = await connectionCapRow({ ...serviceEnv, DATABASE_URL: scratch.url }, load, apiKeys);
    const embeddedModel = await embeddedModelRow({ DATABASE_URL: scratch.url }, load, apiKeys, dataDir, gateway);

    // The embedded store, measured the same way.
    service = await startService({ ...serviceEnv, TYPESAFE_DATA_DIR: dataDir });
    const embeddedDb = createKnex(await embeddedStoreUrl(dataDir), 1);
    const embeddedKeys = await createDefaultAccounts(embeddedDb, ACCOUNTS);
    await embeddedDb.destroy();
    await load.run({ mode: "http", url: `${service.url}/api/v1/decisions`, body: one, apiKeys: embeddedKeys, connections: CONNECTIONS, durationS: 2 });
    const embedded = await load.run({ mode: "http", url: `${service.url}/api/v1/decisions`, body: one, apiKeys: embeddedKeys, connections: CONNECTIONS, durationS: DURATION_S });
    await service.stop();

    const rps = (r: LoadResult) => `${fixed(r.rps)} req/s (p50 ${fixed(r.p50, 1)} ms, p99 ${fixed(r.p99, 1)} ms)`;
    rows.push(
      {
        measure: "metered 1-question decisions, JSON gateway",
        figure: rps(gateway),
        baseline: `bare node:http ${fixed(bareLoad.rps)} req/s`,
        ratio: `${(gateway.rps / bareLoad.rps).toFixed(3)}×`,
        target: "≥ 1,000 req/s and ≥ 0.055×",
        met: gateway.rps >= 1_000 && gateway.rps / bareLoad.rps >= 0.055,
      },
      {
        measure: "the same hops bare: 2 row writes around the upstream call",
        figure: `${rps(chainLoad)}; at a steady ${STEADY_RATE} req/s p50 ${fixed(chainSteady.p50, 2)} ms, p99 ${fixed(chainSteady.p99, 2)} ms`,
        baseline: `bare node:http ${fixed(bareLoad.rps)} req/s; p50 ${fixed(bareSteady.p50, 2)} ms, p99 ${fixed(bareSteady.p99, 2)} ms`,
        ratio: `gateway ${(gateway.rps / chainLoad.rps).toFixed(2)}× of it; ${signedMs(chainSteady.p50 - bareSteady.p50)} / ${signedMs(chainSteady.p99 - bareSteady.p99)} ms`,
        target: "— (the floor any implementation pays here)",
        met: true,
      },
      {
        measure: "PostgreSQL alone: admit + settle SQL pairs",
        figure: `${fixed(sqlPairs.rps)} pairs/s (${CONNECTIONS} callers, batched as the service does, pool of 10; no service)`,
        baseline: `bare node:http ${fixed(bareLoad.rps)} req/s`,
        ratio: `${(sqlPairs.rps / bareLoad.rps).toFixed(3)}×`,
        target: "— (the ceiling of the row above)",
        met: true,
      },
      {
        measure: "gRPC Decide, same load",
        figure: `${rps(grpc)}, service CPU ${fixed(grpc.cpuMs, 2)} ms/call, generator ${fixed(grpc.generatorCpuMsPerCall ?? NaN, 2)} ms/call; generated client ${fixed(grpcClient.rps)} req/s`,
        baseline: `JSON gateway ${fixed(gateway.rps)} req/s, ${fixed(gateway.cpuMs, 2)} ms/call, autocannon ${fixed(gateway.generatorCpuMsPerCall ?? NaN, 2)} ms/call`,
        ratio: `${(grpc.rps / gateway.rps).toFixed(2)}× req/s, ${(grpc.cpuMs / gateway.cpuMs).toFixed(2)}× CPU`,
        target: "≥ 1.0×",
        met: grpc.rps >= gateway.rps,
      },
      {
        measure: "bare gRPC server (node:http2), the gRPC row's generator",
        figure: `${fixed(bareGrpcLoad.rps)} req/s, generator ${fixed(bareGrpcLoad.generatorCpuMsPerCall ?? NaN, 2)} ms/call`,
        baseline: `bare node:http ${fixed(bareLoad.rps)} req/s, autocannon ${fixed(bareLoad.generatorCpuMsPerCall ?? NaN, 2)} ms/call`,
        ratio: `${(bareGrpcLoad.rps / bareLoad.rps).toFixed(2)}×`,
        target: "— (the transports' own ratio: the floor of the row above)",
        met: true,
      },
      {
        measure: `added latency at a steady ${STEADY_RATE} req/s`,
        figure: `p50 ${fixed(steady.p50, 2)} ms, p99 ${fixed(steady.p99, 2)} ms`,
        baseline: `bare p50 ${fixed(bareSteady.p50, 2)} ms, p99 ${fixed(bareSteady.p99, 2)} ms`,
        ratio: `${signedMs(steady.p50 - bareSteady.p50)} / ${signedMs(steady.p99 - bareSteady.p99)} ms (over the bare chain ${signedMs(steady.p50 - chainSteady.p50)} / ${signedMs(steady.p99 - chainSteady.p99)})`,
        target: "p50 ≤ +2 ms, p99 ≤ +8 ms",
        met: steady.p50 - bareSteady.p50 <= 2 && steady.p99 - bareSteady.p99 <= 8,
      },
      {
        measure: "40 questions vs 1, upstream 50 ms, one at a time",
        figure: `p50 ${fixed(fortySerial.p50, 1)} ms`,
        baseline: `1 question p50 ${fixed(oneSerial.p50, 1)} ms`,
        ratio: `${(fortySerial.p50 / oneSerial.p50).toFixed(2)}×`,
        target: "≤ 1.3×",
        met: fortySerial.p50 / oneSerial.p50 <= 1.3,
      },
      {
        measure: "peak RSS of the service under that load",
        figure: `${fixed(rssUnderLoad)} MB`,
        baseline: "—",
        ratio: "—",
        target: "≤ 200 MB",
        met: rssUnderLoad <= 200,
      },
      {
        measure: `peak RSS after ${INVALID_S} s of mixed invalid traffic`,
        figure: `${fixed(rssAfterInvalid)} MB (${fixed(invalid.rps)} req/s, every answer a 4xx)`,
        baseline: "—",
        ratio: "—",
        target: "≤ 200 MB",
        met: rssAfterInvalid <= 200,
      },
      {
        measure: "`npm start` until /readyz, PostgreSQL",
        figure: `${fixed(median(startTimes))} ms (median of ${STARTS})`,
        baseline: "—",
        ratio: "—",
        target: "≤ 1,000 ms",
        met: median(startTimes) <= 1_000,
      },
      {
        measure: "embedded store, 1-question decisions",
        figure: rps(embedded),
        baseline: `PostgreSQL ${fixed(gateway.rps)} req/s`,
        ratio: `${(embedded.rps / gateway.rps).toFixed(2)}×`,
        target: "≥ 200 req/s, p99 ≤ 500 ms",
        met: embedded.rps >= 200 && embedded.p99 <= 500,
      },
      capRow,
      embeddedModel,
    );
    printRows(rows);
  } finally {
    await service?.stop();
    await bare?.close();
    await chain?.close();
    await bareGrpc?.close();
    await load.close();
    await fake.close();
    await scratch.drop();
    await fs.rm(dataDir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
