/**
 * What the bench scripts share: a scratch store they can throw away, bench
 * accounts, the bare baselines (`node:http`, `node:http2` answering as gRPC,
 * and the bare chain of a metered call's hops), and autocannon with its
 * figures checked and printed the same way. Loopback only.
 */
import crypto from "node:crypto";
import fs from "node:fs/promises";
import http from "node:http";
import http2 from "node:http2";
import net, { type AddressInfo } from "node:net";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import type { Knex } from "knex";
import pg from "pg";
import { createApiKey } from "../src/keys/store.js";
import { createAccount } from "../src/admin/account-funding.js";
import { readPublishedSocket } from "../src/db/published-socket.js";

/** A database of its own on a PostgreSQL server, so a run never touches anything it did not create. */
export interface ScratchDatabase {
  url: string;
  /** Drops the database, forcing out connections still open. */
  drop(): Promise<void>;
}

/** Creates a randomly named database on the server at `serverUrl`. */
export async function createScratchDatabase(serverUrl: string): Promise<ScratchDatabase> {
  const name = `typesafe_bench_${crypto.randomBytes(4).toString("hex")}`;
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  const url = new URL(serverUrl);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    drop: async () => {
      await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await admin.end();
    },
  };
}

/** The store a benched service runs on: `env` points its config there, `cleanup` removes it. */
export interface BenchStore {
  env: Record<string, string>;
  cleanup(): Promise<void>;
}

/**
 * A scratch database on `serverUrl` when one is given, else the embedded
 * store in a temp folder: a bench runs with or without a PostgreSQL server.
 */
export async function openBenchStore(serverUrl: string | undefined): Promise<BenchStore> {
  if (serverUrl) {
    const scratch = await createScratchDatabase(serverUrl);
    return { env: { DATABASE_URL: scratch.url }, cleanup: scratch.drop };
  }
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-bench-"));
  return { env: { TYPESAFE_DATA_DIR: dataDir }, cleanup: () => fs.rm(dataDir, { recursive: true, force: true }) };
}

/** The wire address a running service published for its embedded store in `dataDir`. */
export async function embeddedStoreUrl(dataDir: string): Promise<string> {
  const published = await readPublishedSocket(dataDir);
  if (!published) throw new Error(`no running service has published an embedded store in ${dataDir}`);
  return published.url;
}

/**
 * Funded accounts with one key each. Their rate and concurrency limits are far
 * above the product's (60/min, 5 in flight), which would otherwise cap the
 * load at one call per second per account; the 50 ms rate window keeps their
 * admission log near the product's size instead of growing with the load.
 */
export async function createBenchAccounts(
  db: Knex,
  count: number,
  maxInFlight: number,
): Promise<Array<{ id: string; apiKey: string }>> {
  const accounts = [];
  for (let i = 0; i < count; i++) {
    const account = await createAccount(db, { name: "bench", units: 1e15, freeRequests: 0 });
    const { apiKey } = await createApiKey(db, account.id);
    await db("accounts").where({ id: account.id }).update({ rate_limit: 1_000_000_000, rate_window_ms: 50, max_in_flight: maxInFlight });
    accounts.push({ id: account.id, apiKey });
  }
  return accounts;
}

/**
 * Accounts at the product's default limits (60/min, 5 in flight), one key
 * each, funded without end: a load that takes the keys in turn, one per
 * request, spreads over so many accounts that no limit binds and no account
 * row is hot, as with many real callers.
 */
export async function createDefaultAccounts(db: Knex, count: number): Promise<string[]> {
  const keys: string[] = [];
  for (let i = 0; i < count; i++) {
    const account = await createAccount(db, { name: `bench-${i}`, units: 1e15, freeRequests: 0 });
    keys.push((await createApiKey(db, account.id)).apiKey);
  }
  return keys;
}

/** A decision request with `questions` questions, the three types in turn. */
export function decideBody(questions: number): string {
  return JSON.stringify({
    model: "typesafe/service-1.13",
    state: { ticket: "I was charged twice for my pro plan this month", customer: { id: "c-42", plan: "pro" } },
    questions: Object.fromEntries(
      Array.from({ length: questions }, (_, i) => [
        `q${i}`,
        i % 3 === 0
          ? { type: "noul", instructions: `Is aspect ${i} urgent?` }
          : i % 3 === 1
            ? { type: "choice", instructions: `Which team handles aspect ${i}?`, criteria: { billing: null, technical: null, sales: null } }
            : { type: "score", instructions: `How big is impact ${i}?`, criteria: ["none", "low", "medium", "high"] },
      ]),
    ),
  });
}

/** A bare `node:http` server on loopback answering `body` to every request: the throughput baseline. */
export async function startBareBaseline(body: string): Promise<{ url: string; close(): Promise<void> }> {
  const server = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/`,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

/**
 * A bare `node:http2` server answering every stream as a unary gRPC call
 * does: headers, `message` in one length-prefixed frame, trailers with
 * grpc-status 0. Node's stream API, nothing else: the baseline of the gRPC
 * row, as startBareBaseline is the gateway's.
 */
export async function startBareGrpc(message: Uint8Array): Promise<{ url: string; close(): Promise<void> }> {
  const frame = Buffer.alloc(5 + message.byteLength);
  frame.writeUInt32BE(message.byteLength, 1);
  frame.set(message, 5);
  const server = http2.createServer();
  server.on("stream", (stream) => {
    stream.resume();
    stream.on("end", () => {
      stream.respond({ ":status": 200, "content-type": "application/grpc+proto" }, { waitForTrailers: true });
      stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
      stream.end(frame);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

/** What the bare chain (startBareChain) needs: the answer it sends, the upstream and its request, the database. */
export interface BareChainOptions {
  /** The JSON every call answers (the service's own answer). */
  answer: string;
  /** The upstream's chat completions URL and the request body the service sends it (taken from the fake). */
  upstreamUrl: string;
  upstreamBody: string;
  databaseUrl: string;
}

/** The bare statement of bench:metering and bench:sql: one account row written and read back, a commit. */
export const BARE_STATEMENT = { name: "bare_chain_touch", text: "UPDATE accounts SET reserved = reserved WHERE id = $1 AND balance >= 1 RETURNING balance" };

/**
 * The hops of a metered call and nothing else: a `node:http` server that, per
 * request, writes an account row (where the service admits), posts the
 * service's own upstream request and parses the JSON answer, writes the row
 * again (where it settles), then sends a fixed answer. No validation, prompt,
 * metering rules, batching or logging. Whatever a call costs above this, on
 * the same machine and load, is the service's own code; what this costs
 * above bare `node:http` is what any implementation making those hops pays.
 * A pool of 10 and a keep-alive agent, as the service has.
 */
export async function startBareChain(options: BareChainOptions): Promise<{ url: string; close(): Promise<void> }> {
  const pool = new pg.Pool({ connectionString: options.databaseUrl, max: 10 });
  const accountIds = (await pool.query<{ id: string }>("SELECT id FROM accounts ORDER BY id")).rows.map((row) => row.id);
  if (accountIds.length === 0) throw new Error("the bare chain needs accounts in its database");
  const agent = new http.Agent({ keepAlive: true });
  const upstream = new URL(options.upstreamUrl);
  const touch = (i: number) => pool.query({ ...BARE_STATEMENT, values: [accountIds[i % accountIds.length]] });
  const callUpstream = () =>
    new Promise<unknown>((resolve, reject) => {
      const req = http.request(upstream, { method: "POST", agent, headers: { "content-type": "application/json" } }, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (chunk: Buffer) => chunks.push(chunk));
        res.on("end", () => (res.statusCode === 200 ? resolve(JSON.parse(Buffer.concat(chunks).toString("utf8"))) : reject(new Error(`upstream ${res.statusCode}`))));
      });
      req.on("error", reject);
      req.end(options.upstreamBody);
    });
  let next = 0;
  const server = http.createServer((req, res) => {
    const i = next++;
    req.resume();
    req.on("end", () => {
      touch(i)
        .then(callUpstream)
        .then(() => touch(i))
        .then(
          () => {
            res.writeHead(200, { "content-type": "application/json" });
            res.end(options.answer);
          },
          () => {
            res.writeHead(502);
            res.end();
          },
        );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/`,
    close: async () => {
      await new Promise((resolve) => server.close(resolve));
      agent.destroy();
      await pool.end();
    },
  };
}

export interface AutocannonResult {
  requests: { average: number; total: number };
  latency: { p50: number; p99: number; average: number; max: number };
  non2xx: number;
  errors: number;
  timeouts: number;
}
interface AutocannonRequest {
  method?: string;
  path?: string;
  headers?: Record<string, string>;
  body?: string;
}
export interface AutocannonOptions {
  url: string;
  method?: string;
  headers?: Record<string, string>;
  body?: string;
  connections?: number;
  duration?: number;
  setupClient?: (client: { setHeaders(headers: Record<string, string>): void }) => void;
  requests?: Array<
    AutocannonRequest & {
      setupRequest?: (req: AutocannonRequest) => AutocannonRequest;
      onResponse?: (status: number, body: string) => void;
    }
  >;
}
// autocannon ships no type declarations; this is the part of its API the benches use.
const autocannon = createRequire(import.meta.url)("autocannon") as (options: AutocannonOptions) => Promise<AutocannonResult>;

/**
 * One autocannon measure that fails the bench on any non-2xx answer or error,
 * so a figure is never printed for a run that did not do the work. `failures`,
 * when the caller collects them, are quoted in the error.
 */
export async function runAutocannon(options: AutocannonOptions, failures?: string[]): Promise<AutocannonResult> {
  const result = await autocannon(options);
  if (result.non2xx > 0 || result.errors > 0) {
    const quoted = failures ? `; first failures: ${failures.join(" | ")}` : "";
    throw new Error(`${options.url}: ${result.non2xx} non-2xx, ${result.errors} errors${quoted}`);
  }
  return result;
}

/** Prints the header of a `path | req/s | p50 ms | p99 ms | ratio` table and returns its row printer. */
export function printTable(nameWidth: number, rateWidth: number): (name: string, r: AutocannonResult, ratio: string) => void {
  console.log(`${"path".padEnd(nameWidth)} | ${"req/s".padStart(rateWidth)} | p50 ms | p99 ms | ratio`);
  return (name, r, ratio) =>
    console.log(
      `${name.padEnd(nameWidth)} | ${r.requests.average.toFixed(0).padStart(rateWidth)} | ${String(r.latency.p50).padStart(6)} | ${String(r.latency.p99).padStart(6)} | ${ratio}`,
    );
}

/**
 * This process's CPU time (µs) spent in each path's `batch`, over `rounds`
 * rounds that run every path's batch in turn (after one warm-up round), so
 * the machine's drift falls on all paths alike.
 */
export async function alternatedCpuMicros(paths: Record<string, () => Promise<unknown>>, rounds: number): Promise<Map<string, number>> {
  for (const batch of Object.values(paths)) await batch();
  const cpuMicros = new Map<string, number>();
  for (let round = 0; round < rounds; round++) {
    for (const [name, batch] of Object.entries(paths)) {
      const before = process.cpuUsage();
      await batch();
      const used = process.cpuUsage(before);
      cpuMicros.set(name, (cpuMicros.get(name) ?? 0) + used.user + used.system);
    }
  }
  return cpuMicros;
}

/** The middle value (the upper one of an even count): what the benches report of repeated runs. */
export function median(values: number[]): number {
  return [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
}

/**
 * A client of the service on one kept-alive HTTP/1.1 connection, opened before
 * a crowd fills the service's connection cap: what an established caller
 * (a load balancer's pooled connection) still gets then.
 */
export function keptAliveClient(url: string): { get(path: string): Promise<{ status: number; body: string }>; close(): void } {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  return {
    get: (path) =>
      new Promise((resolve, reject) => {
        http
          .get(new URL(path, url), { agent }, (res) => {
            let body = "";
            res.setEncoding("utf8");
            res.on("data", (chunk: string) => (body += chunk));
            res.on("end", () => resolve({ status: res.statusCode!, body }));
          })
          .on("error", reject);
      }),
    close: () => agent.destroy(),
  };
}

/** Opens `count` connections that each send half a request head and then nothing, as stalled clients hold them. */
export async function openHalfHeads(url: string, count: number): Promise<{ close(): void }> {
  const { port, hostname } = new URL(url);
  const sockets = await Promise.all(
    Array.from(
      { length: count },
      () =>
        new Promise<net.Socket>((resolve, reject) => {
          const socket = net.connect(Number(port), hostname, () => socket.write("GET /healthz HTTP/1.1\r\nHost: x\r\n", () => resolve(socket)));
          socket.once("error", reject);
        }),
    ),
  );
  return { close: () => sockets.forEach((socket) => socket.destroy()) };
}

/** Opens one more connection and sends a whole request: whether the service closed it unanswered, and how soon. */
export function probeNewConnection(url: string): Promise<{ refused: boolean; closedAfterMs: number }> {
  const { port, hostname } = new URL(url);
  return new Promise((resolve) => {
    const started = performance.now();
    let answered = false;
    const socket = net.connect(Number(port), hostname, () => socket.write("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    socket.on("data", () => (answered = true));
    socket.on("error", () => {}); // a refused connection may be reset
    socket.once("close", () => resolve({ refused: !answered, closedAfterMs: performance.now() - started }));
  });
}

/** The value of an unlabelled sample in Prometheus text, or NaN when absent. */
export function promSample(text: string, name: string): number {
  const line = text.split("\n").find((l) => l.startsWith(`${name} `));
  return line ? Number(line.slice(name.length + 1)) : NaN;
}
