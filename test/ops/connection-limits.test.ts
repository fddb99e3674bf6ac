import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config.js";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../../src/gen/grpc/health/v1/health_pb.js";
import { createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { holdQuestions } from "../support/held-upstream.js";
import { waitFor } from "../support/wait.js";

/**
 * Connections are bounded like requests: a request head, a request body or an
 * HTTP/2 session that stops making progress is closed by its timeout, an idle
 * connection by the idle timeout, and connections beyond the cap are refused
 * on accept, while clients that behave keep being served.
 */
const HEADERS_MS = 1_500;
const BODY_MS = 1_000;
const IDLE_MS = 3_000;
/** The HTTP/2 connection preface (RFC 9113 §3.4): the magic string, then an empty SETTINGS frame. */
const H2_PREFACE = Buffer.concat([Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0])]);
const decision = {
  model: "typesafe/service-1.13",
  state: "the checkout page returns 500",
  questions: { urgent: { type: "noul", instructions: "Is this urgent?" } },
};

let database: TestDatabase;
let fake: FakeLlm;
beforeAll(async () => {
  database = await createTestDatabase();
  fake = await startFakeLlm();
});
afterAll(async () => {
  await fake?.close();
  await database?.close();
});

/** A funded key whose account's limits do not bind on a client that calls back to back. */
async function unlimitedKey(): Promise<string> {
  const { apiKey, accountId } = await createTestAccount(database.db, { units: 1e12 });
  await database.db("accounts").where({ id: accountId }).update({ rate_limit: 1_000_000_000, max_in_flight: 1_000 });
  return apiKey;
}

/** The value of one sample of the Prometheus text format (0 when absent). */
function sample(text: string, name: string, label?: string): number {
  const line = text.split("\n").find((l) => l.startsWith(label ? `${name}{${label}} ` : `${name} `));
  return line ? Number(line.split(" ").at(-1)) : 0;
}

/** What a raw client connection saw: when it connected and closed, and every byte it received. */
interface Watched {
  socket: net.Socket;
  connectedAt: number;
  /** When the last byte so far arrived. */
  receivedAt: number;
  received: Buffer;
  closed: Promise<number>;
}

/** Opens a raw TCP connection, sends `bytes` once connected, and records what comes back until the server closes it. */
function openRaw(port: number, bytes: Buffer | string | undefined): Promise<Watched> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, "127.0.0.1");
    const watched: Watched = { socket, connectedAt: 0, receivedAt: 0, received: Buffer.alloc(0), closed: Promise.resolve(0) };
    watched.closed = new Promise((closed) => socket.once("close", () => closed(performance.now())));
    socket.on("data", (chunk: Buffer) => {
      watched.received = Buffer.concat([watched.received, chunk]);
      watched.receivedAt = performance.now();
    });
    socket.on("error", () => {}); // a refused or timed-out connection may be reset
    socket.once("connect", () => {
      watched.connectedAt = performance.now();
      if (bytes === undefined) return resolve(watched);
      socket.write(bytes, (err) => (err ? reject(err) : resolve(watched)));
    });
  });
}

describe("connection timeouts", () => {
  let service: TestApp;
  let port: number;
  let apiKey: string;
  const metrics = async () => (await fetch(`${service.url}/metrics`)).text();

  beforeAll(async () => {
    service = await startTestApp(database, {
      TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
      TYPESAFE_HEADERS_TIMEOUT_MS: String(HEADERS_MS),
      TYPESAFE_BODY_TIMEOUT_MS: String(BODY_MS),
      TYPESAFE_IDLE_TIMEOUT_MS: String(IDLE_MS),
    });
    port = service.app.server.port;
    apiKey = await unlimitedKey();
  });
  afterAll(async () => {
    await service?.stop();
  });

  it("closes hundreds of half-started heads, preface-only HTTP/2 sessions and stalled bodies by their timeouts while a normal client is served", async () => {
    // A normal client, on HTTP/1.1 (health, a decision) and on HTTP/2 (gRPC health), its connections warm.
    const grpc = createClient(Health, createGrpcTransport({ baseUrl: service.url }));
    const round = async () => {
      expect((await fetch(`${service.url}/healthz`)).status).toBe(200);
      expect((await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey })).status).toBe(200);
      expect((await grpc.check({ service: "" })).status).toBe(ServingStatus.SERVING);
      return { ended: performance.now() };
    };
    await round();

    const before = await metrics();
    const halfHeads = await Promise.all(Array.from({ length: 300 }, () => openRaw(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n")));
    const prefaces = await Promise.all(Array.from({ length: 100 }, () => openRaw(port, H2_PREFACE)));
    const stalledBodies = await Promise.all(
      Array.from({ length: 50 }, () =>
        openRaw(
          port,
          `POST /api/v1/decisions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${apiKey}\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{"model":`,
        ),
      ),
    );
    const everyone = [...halfHeads, ...prefaces, ...stalledBodies];
    let firstClosedAt = Infinity;
    for (const w of everyone) void w.closed.then((at) => (firstClosedAt = Math.min(firstClosedAt, at)));
    let allClosed = false;
    const closedAll = Promise.all(everyone.map((w) => w.closed)).then(() => (allClosed = true));

    // Back to back until the last of them is closed; at least one whole round while every one of them was held.
    const rounds = [];
    while (!allClosed) rounds.push(await round());
    await closedAll;
    expect(rounds.filter((r) => r.ended < firstClosedAt).length).toBeGreaterThan(0);

    // Each was closed by its own timeout, not before it; a half head is told why.
    for (const w of [...halfHeads, ...prefaces]) expect((await w.closed) - w.connectedAt).toBeGreaterThanOrEqual(HEADERS_MS - 20);
    for (const w of stalledBodies) expect((await w.closed) - w.connectedAt).toBeGreaterThanOrEqual(BODY_MS - 20);
    expect(halfHeads.every((w) => w.received.toString().startsWith("HTTP/1.1 408 "))).toBe(true);
    expect(stalledBodies.every((w) => w.received.length === 0)).toBe(true);

    const after = await metrics();
    const grew = (timeout: string) =>
      sample(after, "typesafe_connections_timed_out_total", `timeout="${timeout}"`) - sample(before, "typesafe_connections_timed_out_total", `timeout="${timeout}"`);
    expect(grew("headers")).toBe(halfHeads.length + prefaces.length);
    expect(grew("body")).toBe(stalledBodies.length);
  });

  it("resets an HTTP/2 stream whose body stalls, and the session stays usable", async () => {
    const before = await metrics();
    const session = http2.connect(service.url);
    try {
      const stalled = session.request({
        ":method": "POST",
        ":path": "/typesafe.decision.v1.DecisionService/Decide",
        "content-type": "application/grpc",
        te: "trailers",
        authorization: `Bearer ${apiKey}`,
      });
      stalled.on("error", () => {});
      // A gRPC message prefix announcing 100 bytes (gRPC over HTTP/2: flag, 4-byte length), then nothing.
      stalled.write(Buffer.from([0, 0, 0, 0, 100]));
      const sentAt = performance.now();
      await new Promise((resolve) => stalled.once("close", resolve));
      expect(performance.now() - sentAt).toBeGreaterThanOrEqual(BODY_MS - 20);
      expect(stalled.rstCode).toBe(http2.constants.NGHTTP2_CANCEL);

      const health = session.request({ ":method": "GET", ":path": "/healthz" });
      health.end();
      expect((await responseOf(health))[":status"]).toBe(200);
      health.resume();
    } finally {
      session.destroy();
    }
    const grew = sample(await metrics(), "typesafe_connections_timed_out_total", 'timeout="body"') - sample(before, "typesafe_connections_timed_out_total", 'timeout="body"');
    expect(grew).toBe(1);
  });

  it("closes idle keep-alive connections on HTTP/1.1 and HTTP/2 after the idle timeout", async () => {
    const before = await metrics();
    const h1 = await openRaw(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    await waitFor(() => h1.received.includes("\r\n\r\n"), "the HTTP/1.1 answer");
    const session = http2.connect(service.url);
    const h2Closed = new Promise<number>((resolve) => session.once("close", () => resolve(performance.now())));
    const goaway = new Promise<[number, number]>((resolve) => session.once("goaway", (code: number, lastStreamId: number) => resolve([code, lastStreamId])));
    const stream = session.request({ ":method": "GET", ":path": "/healthz" });
    stream.end();
    stream.resume();
    await new Promise((resolve) => stream.once("close", resolve));
    const streamDoneAt = performance.now();

    expect((await h1.closed) - h1.receivedAt).toBeGreaterThanOrEqual(IDLE_MS - 20);
    expect(h1.received.toString().startsWith("HTTP/1.1 200 ")).toBe(true);
    // The idle timeout is advertised, so clients that read the hint retire the connection first.
    expect(h1.received.toString()).toMatch(/\r\nkeep-alive: timeout=3\r\n/i);
    // HTTP/2 ends gracefully: first a GOAWAY that refuses no stream already on its way (RFC 9113 §6.8), then the close.
    expect(await goaway).toEqual([http2.constants.NGHTTP2_NO_ERROR, 2 ** 31 - 1]);
    expect((await h2Closed) - streamDoneAt).toBeGreaterThanOrEqual(IDLE_MS - 20);
    const grew = sample(await metrics(), "typesafe_connections_timed_out_total", 'timeout="idle"') - sample(before, "typesafe_connections_timed_out_total", 'timeout="idle"');
    expect(grew).toBeGreaterThanOrEqual(2);
  });

  it("a call that outlasts every timeout is answered on HTTP/1.1 and HTTP/2", async () => {
    const upstream = holdQuestions(fake);
    try {
      const gateway = postJson(`${service.url}/api/v1/decisions`, decision, { apiKey });
      const connect = fetchOverH2(service.url, decision, apiKey);
      await upstream.reached;
      // Proof that each timer had its time: connections opened now are closed by each timeout.
      const idle = await openRaw(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
      const head = await openRaw(port, "GET /healthz HTTP/1.1\r\n");
      const body = await openRaw(port, `POST /api/v1/decisions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${apiKey}\r\nContent-Length: 50\r\n\r\n{`);
      await Promise.all([idle.closed, head.closed, body.closed]);
      upstream.release();
      expect((await gateway).status).toBe(200);
      expect(await connect).toEqual({ status: 200, goaway: false });
    } finally {
      upstream.release();
    }
  });
});

/** The response headers of an HTTP/2 client stream. */
function responseOf(stream: http2.ClientHttp2Stream): Promise<http2.IncomingHttpHeaders> {
  return new Promise((resolve) => stream.once("response", (headers) => resolve(headers)));
}

/**
 * A Connect unary decision over an HTTP/2 connection of its own, after a quick
 * call on it (so the connection has been idle before): the status, or the
 * reset code when the stream was reset, and whether the server sent GOAWAY.
 */
async function fetchOverH2(url: string, body: unknown, apiKey: string): Promise<{ status: number; rstCode?: number; goaway: boolean }> {
  const session = http2.connect(url);
  let goaway = false;
  session.on("goaway", () => (goaway = true));
  session.on("error", () => {});
  try {
    const warmUp = session.request({ ":method": "GET", ":path": "/healthz" });
    warmUp.end();
    warmUp.resume();
    await new Promise((resolve) => warmUp.once("close", resolve));
    const stream = session.request({
      ":method": "POST",
      ":path": "/typesafe.decision.v1.DecisionService/Decide",
      "content-type": "application/json",
      authorization: `Bearer ${apiKey}`,
    });
    stream.on("error", () => {});
    stream.end(JSON.stringify(body));
    let status = 0;
    stream.once("response", (headers) => (status = Number(headers[":status"])));
    stream.resume();
    await new Promise((resolve) => stream.once("close", resolve));
    return status === 0 ? { status, rstCode: stream.rstCode, goaway } : { status, goaway };
  } finally {
    session.destroy();
  }
}

describe("a request that arrives as the idle timer fires", () => {
  let service: TestApp;
  let apiKey: string;
  beforeAll(async () => {
    service = await startTestApp(database, { TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_IDLE_TIMEOUT_MS: "100" });
    apiKey = await unlimitedKey();
  });
  afterAll(async () => {
    await service?.stop();
  });

  it("a 1 MB chunked decision sent on a keep-alive connection across the idle timeout gets its 413 or a clean close, never a reset (EPIPE, ECONNRESET)", async () => {
    const head = `POST /api/v1/decisions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer ${apiKey}\r\nTransfer-Encoding: chunked\r\n\r\n`;
    const chunk = `4000\r\n${"x".repeat(0x4000)}\r\n`;
    const outcomes: string[] = [];
    // The second request starts from 10 ms before to 10 ms after the idle timeout: some meet the close as it happens.
    for (let i = 0; i < 60; i++) {
      const socket = net.connect(service.app.server.port, "127.0.0.1");
      let text = "";
      let error = "";
      // The wait is timed from the first answer's arrival, when the server's idle timer starts.
      const firstAnswer = new Promise<void>((resolve) => socket.once("data", () => resolve()));
      socket.on("data", (c: Buffer) => (text += c.toString("latin1")));
      socket.on("error", (e: NodeJS.ErrnoException) => (error ||= e.code ?? e.message));
      let closed = false;
      socket.once("close", () => (closed = true));
      socket.write("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
      await firstAnswer;
      const sentAt = performance.now();
      await new Promise((resolve) => setTimeout(resolve, 90 + (i % 21)));
      text = "";
      if (!socket.destroyed) {
        socket.write(head);
        for (let k = 0; k < 64; k++) socket.write(chunk);
        socket.write("0\r\n\r\n");
      }
      await waitFor(() => text.includes("}}") || closed, "the 413 or the close", 10_000);
      socket.destroy();
      outcomes.push(text.startsWith("HTTP/1.1 413") ? "413" : error === "" ? "closed" : `${error} after ${(performance.now() - sentAt).toFixed(0)} ms`);
    }
    expect(outcomes.filter((o) => o !== "413" && o !== "closed")).toEqual([]);
  });
});

describe("the connection cap", () => {
  const CAP = 40;
  let service: TestApp;
  let port: number;

  beforeAll(async () => {
    service = await startTestApp(database, {
      TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
      TYPESAFE_MAX_CONNECTIONS: String(CAP),
      // The fillers must stay for the whole test: only the cap may act on them.
      TYPESAFE_HEADERS_TIMEOUT_MS: "120000",
      TYPESAFE_IDLE_TIMEOUT_MS: "120000",
    });
    port = service.app.server.port;
  });
  afterAll(async () => {
    await service?.stop();
  });

  it("refuses a new connection at once when full, while open connections keep being served", async () => {
    const apiKey = await unlimitedKey();
    // One kept-alive HTTP/1.1 connection and one HTTP/2 session, open before the cap is reached.
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const get = (path: string) =>
      new Promise<{ status: number; reused: boolean; body: string }>((resolve, reject) => {
        const req = http.get({ host: "127.0.0.1", port, path, agent }, (res) => {
          let body = "";
          res.setEncoding("utf8");
          res.on("data", (chunk: string) => (body += chunk));
          res.on("end", () => resolve({ status: res.statusCode!, reused: req.reusedSocket, body }));
        });
        req.on("error", reject);
      });
    const grpc = createClient(Health, createGrpcTransport({ baseUrl: service.url }));
    try {
      expect((await get("/healthz")).status).toBe(200);
      expect((await grpc.check({ service: "" })).status).toBe(ServingStatus.SERVING);

      const fillers = await Promise.all(Array.from({ length: CAP - 2 }, () => openRaw(port, undefined)));
      await waitFor(async () => sample((await get("/metrics")).body, "typesafe_connections_open") === CAP, `${CAP} open connections`);
      const refusedBefore = sample((await get("/metrics")).body, "typesafe_connections_refused_total");

      const extra = await openRaw(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
      const closedAfterMs = (await extra.closed) - extra.connectedAt;
      expect(extra.received.length).toBe(0);
      expect(closedAfterMs).toBeLessThan(5_000); // far below every timeout of this service

      const health = await get("/healthz");
      expect(health).toMatchObject({ status: 200, reused: true });
      expect((await get("/readyz")).status).toBe(200);
      expect((await grpc.check({ service: "" })).status).toBe(ServingStatus.SERVING);
      const metricsText = (await get("/metrics")).body;
      expect(sample(metricsText, "typesafe_connections_refused_total")).toBe(refusedBefore + 1);
      expect(sample(metricsText, "typesafe_connections_open")).toBe(CAP);

      // A place freed is a place taken: the next new connection is served.
      fillers[0]!.socket.destroy();
      await waitFor(async () => sample((await get("/metrics")).body, "typesafe_connections_open") === CAP - 1, "a freed place");
      expect((await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey })).status).toBe(200);
      for (const filler of fillers) filler.socket.destroy();
    } finally {
      agent.destroy();
    }
  });
});

describe("stopping", () => {
  it("idle keep-alive connections, a half-sent head and an idle HTTP/2 session do not hold up a stop (grace 60 s, test limit 30 s)", async () => {
    const service = await startTestApp(database, { TYPESAFE_SHUTDOWN_GRACE_MS: "60000" });
    const port = service.app.server.port;
    const keptAlive = await openRaw(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    await waitFor(() => keptAlive.received.includes("\r\n\r\n"), "the HTTP/1.1 answer");
    const halfHead = await openRaw(port, "GET /healthz HTTP/1.1\r\n");
    const session = http2.connect(service.url);
    session.on("error", () => {});
    const sessionClosed = new Promise((resolve) => session.once("close", resolve));
    const health = session.request({ ":method": "GET", ":path": "/healthz" });
    health.end();
    health.resume();
    await new Promise((resolve) => health.once("close", resolve));
    await service.stop();
    await Promise.all([keptAlive.closed, halfHead.closed, sessionClosed]);
  });
});

describe("configuration", () => {
  it("has defaults like the big proxies' and takes each limit from its own variable", () => {
    expect(loadConfig({}).connections).toEqual({ headersTimeoutMs: 10_000, bodyTimeoutMs: 20_000, idleTimeoutMs: 75_000, lingerTimeMs: 30_000, maxConnections: 4_096 });
    expect(
      loadConfig({
        TYPESAFE_HEADERS_TIMEOUT_MS: "1000",
        TYPESAFE_BODY_TIMEOUT_MS: "2000",
        TYPESAFE_IDLE_TIMEOUT_MS: "3000",
        TYPESAFE_LINGER_TIME_MS: "4000",
        TYPESAFE_MAX_CONNECTIONS: "40",
      }).connections,
    ).toEqual({ headersTimeoutMs: 1_000, bodyTimeoutMs: 2_000, idleTimeoutMs: 3_000, lingerTimeMs: 4_000, maxConnections: 40 });
  });

  it.each([
    ["TYPESAFE_HEADERS_TIMEOUT_MS", "0"],
    ["TYPESAFE_BODY_TIMEOUT_MS", "ten"],
    ["TYPESAFE_IDLE_TIMEOUT_MS", "-1"],
    ["TYPESAFE_MAX_CONNECTIONS", "0"],
  ])("refuses %s=%s, naming the variable", (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(new RegExp(`${name}: must be an integer between`));
  });
});
