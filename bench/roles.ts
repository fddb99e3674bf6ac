/**
 * The roles of bench/processes.ts's children, one per process:
 *   --fake-upstream  an OpenAI-compatible upstream answering every question (delay set over IPC)
 *   --bare           a bare `node:http` server answering a fixed body (the baseline), a bare gRPC server, or the bare chain of a call's hops
 *   --load           the load generator: autocannon (closed loop), a fixed-rate open loop, or gRPC calls (pre-built or a generated client)
 * Each sends one IPC message when ready and answers each message it gets with one.
 */
import crypto from "node:crypto";
import http from "node:http";
import http2 from "node:http2";
import { createRequire } from "node:module";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { encodeEnvelope } from "@connectrpc/connect/protocol";
import { fromJsonString, toBinary } from "@bufbuild/protobuf";
import { hashApiKey } from "../src/keys/api-keys.js";
import { createKnex } from "../src/db/database.js";
import { DecideRequestSchema, DecisionService } from "../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { prepareStatementsOn } from "../src/metering/ledger.js";
import { createBatchedLedger, decisionReserveUnits } from "../src/metering/meter.js";
import { isProbe, logprobsReply, PROBE_OK, startFakeLlm } from "../test/support/fake-llm.js";
import { startBareBaseline, startBareChain, startBareGrpc, type BareChainOptions } from "./support.js";

export interface LoadOptions {
  /**
   * http: autocannon, as many requests as the connections take; rate: `rate` requests/s whatever the answers;
   * grpc: binary gRPC Decide through a generated Connect client; grpc-frames: the same call as pre-built HTTP/2 requests; invalid: autocannon with bad requests in turn on both paths (every answer must be a 4xx);
   * sql-pair: no service at all, the two metering statements of a call (admit, then settle) sent to the database at `url` from `connections` callers, batched as the service batches them.
   */
  mode: "http" | "rate" | "grpc" | "grpc-frames" | "invalid" | "sql-pair";
  url: string;
  /** The JSON request body (for gRPC, the same request in its JSON form). */
  body: string;
  /** Keys used in turn, one per request, as many callers would. */
  apiKeys: string[];
  /** http only: a body per key (the same index), for requests that name something of the key's account, such as a calibration. */
  bodies?: string[];
  connections: number;
  durationS: number;
  rate?: number;
}

export interface LoadResult {
  rps: number;
  /** Milliseconds, with microsecond resolution where the mode measures it (rate, grpc). */
  p50: number;
  p99: number;
  requests: number;
  /** The load generator's own CPU (user + system, every thread) per request: its share of the two cores. */
  generatorCpuMsPerCall?: number;
}

const reply = (message: object) => process.send!(message);

async function fakeUpstream(): Promise<void> {
  let delayMs = 0;
  const fake = await startFakeLlm((r) =>
    isProbe(r.body)
      ? PROBE_OK
      : { ...logprobsReply({ yes: 0.6, no: 0.2, A: 0.1, "1": 0.05, "2": 0.05 }, { prompt: 180, cached: 150 }), delayMs },
  );
  process.on("message", (message: { delayMs: number } | { lastQuestion: true }) => {
    if ("lastQuestion" in message) {
      // What the service last asked, for the bare chain to send the same.
      const last = fake.questionRequests().at(-1);
      return reply(last ? { url: `${fake.url}${last.path}`, body: last.raw } : { error: "no question has reached the fake upstream" });
    }
    delayMs = message.delayMs;
    reply({ ok: true });
  });
  process.once("SIGTERM", () => void fake.close().then(() => process.exit(0)));
  reply({ url: fake.url });
}

/** Waits for what to serve, then serves it (bench/support.ts): a fixed body (the baseline server), a fixed gRPC answer, or the bare chain. */
async function bare(): Promise<void> {
  process.once("message", (message: { body: string } | { grpcMessage: string } | { chain: BareChainOptions }) => {
    const started =
      "chain" in message
        ? startBareChain(message.chain)
        : "grpcMessage" in message
          ? startBareGrpc(Buffer.from(message.grpcMessage))
          : startBareBaseline(message.body);
    started.then(
      (server) => reply({ url: server.url }),
      (err: unknown) => reply({ error: err instanceof Error ? err.message : String(err) }),
    );
  });
  process.once("SIGTERM", () => process.exit(0));
  reply({ ready: true });
}

interface AutocannonRequest {
  method?: string;
  headers?: Record<string, string>;
  body?: string;
}
// autocannon ships no type declarations; this is the part of its API used here.
const autocannon = createRequire(import.meta.url)("autocannon") as (options: object) => Promise<{
  requests: { average: number; total: number };
  latency: { p50: number; p99: number };
  non2xx: number;
  errors: number;
  statusCodeStats?: Record<string, { count: number }>;
}>;

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? NaN;
}

async function closedLoop(options: LoadOptions): Promise<LoadResult> {
  let next = 0;
  const headers = { "content-type": "application/json" };
  const result = await autocannon({
    url: options.url,
    connections: options.connections,
    duration: options.durationS,
    requests: [
      {
        method: "POST",
        body: options.body,
        headers,
        setupRequest: (req: AutocannonRequest) => {
          const i = next++ % options.apiKeys.length;
          return { ...req, ...(options.bodies ? { body: options.bodies[i] } : {}), headers: { ...headers, authorization: `Bearer ${options.apiKeys[i]}` } };
        },
      },
    ],
  });
  if (result.non2xx > 0 || result.errors > 0) {
    // The statuses say which limit or failure answered (a 429 is a limit, a 503 shedding, a 5xx a fault).
    const statuses = Object.entries(result.statusCodeStats ?? {}).map(([code, { count }]) => `${code}: ${count}`).join(", ");
    throw new Error(`${result.non2xx} non-2xx answers (${statuses}), ${result.errors} errors`);
  }
  return { rps: result.requests.average, p50: result.latency.p50, p99: result.latency.p99, requests: result.requests.total };
}

/** Bad input of every kind a careless or hostile client sends: each must be refused with a 4xx, none may cost memory for long. */
const INVALID_BODIES = [
  "{",
  '{"model":"typesafe/service-1.13"}',
  JSON.stringify({ model: "typesafe/service-1.13", state: { a: 1 }, questions: { q: { type: "bogus" } } }),
  JSON.stringify({ model: "typesafe/service-1.13", state: "x".repeat(200_000), questions: {} }),
  '{"__proto__":{"admin":true}}',
  JSON.stringify({ q: "hello", sources: ["nope"] }),
];

async function invalidLoop(options: LoadOptions): Promise<LoadResult> {
  let next = 0;
  const result = (await autocannon({
    url: options.url,
    connections: options.connections,
    duration: options.durationS,
    requests: [
      {
        method: "POST",
        setupRequest: (req: AutocannonRequest) => {
          const i = next++;
          // Every fifth request carries a key nobody issued.
          const key = i % 5 === 0 ? `ts_live_${"0".repeat(40)}${i}` : options.apiKeys[i % options.apiKeys.length];
          return {
            ...req,
            path: i % 2 === 0 ? "/api/v1/decisions" : "/api/v1/search",
            body: INVALID_BODIES[i % INVALID_BODIES.length],
            headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
          };
        },
      },
    ],
  })) as Awaited<ReturnType<typeof autocannon>> & { "2xx": number; "5xx": number };
  if (result.errors > 0 || result["5xx"] > 0 || result["2xx"] > 0) {
    throw new Error(`bad input answered ${result["2xx"]} × 2xx, ${result["5xx"]} × 5xx, ${result.errors} errors`);
  }
  return { rps: result.requests.average, p50: result.latency.p50, p99: result.latency.p99, requests: result.requests.total };
}

/** Sends `rate` requests per second on a schedule that does not wait for answers (an open loop), timing each. */
async function openLoop(options: LoadOptions): Promise<LoadResult> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: options.connections });
  const target = new URL(options.url);
  const total = Math.round(options.rate! * options.durationS);
  const latencies: number[] = [];
  let failed = 0;
  const send = (i: number) =>
    new Promise<void>((resolve) => {
      const started = performance.now();
      const req = http.request(
        target,
        {
          method: "POST",
          agent,
          headers: { "content-type": "application/json", authorization: `Bearer ${options.apiKeys[i % options.apiKeys.length]}` },
        },
        (res) => {
          res.resume();
          res.on("end", () => {
            if (res.statusCode === 200) latencies.push(performance.now() - started);
            else failed++;
            resolve();
          });
        },
      );
      req.on("error", () => {
        failed++;
        resolve();
      });
      req.end(options.body);
    });
  const began = performance.now();
  const inFlight: Array<Promise<void>> = [];
  for (let i = 0; i < total; i++) {
    const due = began + (i * 1000) / options.rate!;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    inFlight.push(send(i));
  }
  await Promise.all(inFlight);
  agent.destroy();
  if (failed > 0) throw new Error(`${failed} of ${total} requests failed`);
  const sorted = latencies.sort((a, b) => a - b);
  return { rps: total / ((performance.now() - began) / 1000), p50: percentile(sorted, 50), p99: percentile(sorted, 99), requests: total };
}

/** `options.connections` loops, each making `call` with the next key in turn (and its index), one call at a time, for `options.durationS`. */
async function concurrentLoops(options: LoadOptions, call: (apiKey: string, index: number) => Promise<unknown>): Promise<LoadResult> {
  const latencies: number[] = [];
  let next = 0;
  const until = performance.now() + options.durationS * 1000;
  const began = performance.now();
  await Promise.all(
    Array.from({ length: options.connections }, async () => {
      while (performance.now() < until) {
        const started = performance.now();
        const index = next++;
        await call(options.apiKeys[index % options.apiKeys.length]!, index);
        latencies.push(performance.now() - started);
      }
    }),
  );
  const sorted = latencies.sort((a, b) => a - b);
  return { rps: latencies.length / ((performance.now() - began) / 1000), p50: percentile(sorted, 50), p99: percentile(sorted, 99), requests: latencies.length };
}

/** Concurrent binary gRPC Decide calls over one HTTP/2 connection, as a generated client makes them. */
async function grpcLoop(options: LoadOptions): Promise<LoadResult> {
  const client = createClient(DecisionService, createGrpcTransport({ baseUrl: options.url }));
  const request = fromJsonString(DecideRequestSchema, options.body);
  return concurrentLoops(options, (apiKey) => client.decide(request, { headers: { authorization: `Bearer ${apiKey}` } }));
}

/**
 * `connections` concurrent streams of binary gRPC Decide over one HTTP/2
 * connection, each sending the same pre-encoded frame, as autocannon sends a
 * pre-built HTTP/1.1 request: the generator's own cost stays as small as on
 * the gateway's side. Every answer must be HTTP 200 with grpc-status 0.
 */
async function grpcFramesLoop(options: LoadOptions): Promise<LoadResult> {
  const frame = encodeEnvelope(0, toBinary(DecideRequestSchema, fromJsonString(DecideRequestSchema, options.body)));
  const path = `/${DecisionService.typeName}/${DecisionService.method.decide.name}`;
  const session = http2.connect(options.url);
  await new Promise<void>((resolve, reject) => session.once("connect", () => resolve()).once("error", reject));
  const call = (apiKey: string) =>
    new Promise<void>((resolve, reject) => {
      const stream = session.request({
        ":method": "POST",
        ":path": path,
        "content-type": "application/grpc",
        te: "trailers",
        authorization: `Bearer ${apiKey}`,
      });
      let status: unknown;
      stream.once("response", (headers) => (status = headers[":status"]));
      stream.once("trailers", (trailers) => {
        if (status !== 200 || trailers["grpc-status"] !== "0") reject(new Error(`answered ${String(status)}, grpc-status ${String(trailers["grpc-status"])}`));
      });
      stream.on("data", () => {});
      stream.once("end", resolve);
      stream.once("error", reject);
      stream.end(frame);
    });
  try {
    return await concurrentLoops(options, call);
  } finally {
    session.close();
  }
}

/**
 * What PostgreSQL alone gives a metered call: admit + settle pairs per second
 * with nothing in front of it, the ceiling of the gateway's figure on the
 * same cores. The pairs go as the service sends them (the meter's batchers,
 * the ledger's statements, a pool of 10 connections), from `connections`
 * callers at once. Each pair must be admitted and settled.
 */
async function sqlPairLoop(options: LoadOptions): Promise<LoadResult> {
  const db = createKnex(options.url, 10);
  const keyHashes = options.apiKeys.map(hashApiKey);
  const { admit, finish: settle } = createBatchedLedger(db, undefined);
  try {
    await prepareStatementsOn(db);
    return await concurrentLoops(options, async (_apiKey, i) => {
      const admission = await admit({
        keyHash: keyHashes[i % keyHashes.length]!,
        endpoint: "decide",
        reserveUnits: decisionReserveUnits(1),
        freeAllowed: false,
        leaseMs: 60_000,
        requestId: crypto.randomUUID(),
      });
      if (admission.outcome !== "admitted") throw new Error(`admission ${admission.outcome}`);
      const settled = await settle({ requestId: admission.requestId, success: true, actualUnits: 1_000 });
      if (settled.outcome !== "settled") throw new Error(`settle ${settled.outcome}`);
    });
  } finally {
    await db.destroy();
  }
}

async function load(): Promise<void> {
  process.on("message", (options: LoadOptions) => {
    if (options.bodies && options.mode !== "http") return reply({ error: `a body per key is for the http mode only, not ${options.mode}` });
    const measure = { http: closedLoop, rate: openLoop, grpc: grpcLoop, "grpc-frames": grpcFramesLoop, invalid: invalidLoop, "sql-pair": sqlPairLoop }[options.mode];
    const before = process.cpuUsage();
    measure(options).then(
      (result) => {
        const used = process.cpuUsage(before);
        reply({ ...result, generatorCpuMsPerCall: (used.user + used.system) / 1000 / result.requests });
      },
      (err: unknown) => reply({ error: err instanceof Error ? err.message : String(err) }),
    );
  });
  process.once("SIGTERM", () => process.exit(0));
  reply({ ready: true });
}

const roles: Record<string, () => Promise<void>> = { "--fake-upstream": fakeUpstream, "--bare": bare, "--load": load };
const role = roles[process.argv[2] ?? ""];
if (!role) {
  console.error(`bench/roles.ts: unknown role ${process.argv[2]}; one of ${Object.keys(roles).join(", ")}`);
  process.exit(2);
}
role().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
