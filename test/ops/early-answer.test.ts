import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";

/**
 * An answer sent before the body was read (401, 413, 415) reaches a client
 * that is still sending: the service reads and discards the rest, within a
 * bound of bytes and of time, and closes lingering (its FIN after the answer,
 * never a reset that could take the answer with it), on both HTTP/1.1 doors:
 * the JSON gateway and Connect.
 */
const LINGER_MS = 1_500;
const CHUNK = Buffer.alloc(16 * 1024, "a");
const CHUNK_FRAME = Buffer.concat([Buffer.from(`${CHUNK.length.toString(16)}\r\n`), CHUNK, Buffer.from("\r\n")]);

interface Sent {
  /** The answer as far as it arrived: status, and its body when it arrived whole. */
  status: number | undefined;
  body: string | undefined;
  /** The first socket error the client met (a write after the server closed: EPIPE or ECONNRESET). */
  error: string | undefined;
  sentBytes: number;
  /** When the server closed the connection, after the client started sending. */
  closedAfterMs: number;
}

interface SendOptions {
  totalBytes: number;
  /** Waits this long between two chunks (pacing a slow sender, not synchronisation); 0 writes as fast as the socket takes. */
  paceMs?: number;
  /** Reads nothing until the whole body is written, as a client that writes first and reads after does. */
  readAfterWriting?: boolean;
  /** Sends a broken chunk after this many bytes, as a fuzzer would, then goes on sending. */
  breakAfterBytes?: number;
}

/** Sends a chunked body over a raw HTTP/1.1 connection and records the answer; resolves once the connection is closed. */
function sendChunked(port: number, path: string, headers: Record<string, string>, options: SendOptions): Promise<Sent> {
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    const started = performance.now();
    let received = Buffer.alloc(0);
    let error: string | undefined;
    let sentBytes = 0;
    let bodySent = false;
    const answer = () => {
      const text = received.toString("utf8");
      const split = text.indexOf("\r\n\r\n");
      const length = Number(/\r\ncontent-length: (\d+)/i.exec(text)?.[1] ?? NaN);
      const body = split >= 0 && Buffer.byteLength(text.slice(split + 4)) >= length ? text.slice(split + 4, split + 4 + length) : undefined;
      return { status: Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1]) || undefined, body };
    };
    // A whole answer to a whole body: the exchange is over (the connection itself would stay open for the next request).
    const endIfDone = () => bodySent && answer().body !== undefined && socket.end();
    socket.on("data", (chunk: Buffer) => {
      received = Buffer.concat([received, chunk]);
      endIfDone();
    });
    socket.on("error", (err: NodeJS.ErrnoException) => (error ??= err.code));
    socket.once("close", () => resolve({ ...answer(), error, sentBytes, closedAfterMs: performance.now() - started }));
    if (options.readAfterWriting) socket.pause();
    const finish = (last: string) =>
      socket.write(last, () => {
        bodySent = true;
        socket.resume();
        endIfDone();
      });
    let broken = false;
    const next = () => {
      if (socket.destroyed || error) return void (error && socket.resume());
      if (sentBytes >= options.totalBytes) return void finish("0\r\n\r\n");
      const breakNow = !broken && options.breakAfterBytes !== undefined && sentBytes >= options.breakAfterBytes;
      broken ||= breakNow;
      sentBytes += CHUNK.length;
      const flowing = socket.write(breakNow ? "zz\r\nnot a chunk\r\n" : CHUNK_FRAME, () => options.paceMs && setTimeout(next, options.paceMs));
      if (!options.paceMs) flowing ? setImmediate(next) : socket.once("drain", next);
    };
    socket.once("connect", () => {
      const head = Object.entries({ host: "localhost", "transfer-encoding": "chunked", ...headers }).map(([k, v]) => `${k}: ${v}\r\n`);
      socket.write(`POST ${path} HTTP/1.1\r\n${head.join("")}\r\n`);
      next();
    });
  });
}

let database: TestDatabase;
let service: TestApp;
let port: number;
let apiKey: string;
beforeAll(async () => {
  database = await createTestDatabase();
  service = await startTestApp(database, { TYPESAFE_LINGER_TIME_MS: String(LINGER_MS) });
  port = service.app.server.port;
  ({ apiKey } = await createTestAccount(database.db, { units: 1_000 }));
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

const GATEWAY = "/api/v1/search";
const CONNECT = "/typesafe.search.v1.SearchService/Search";
const json = { "content-type": "application/json" };
/** Each early answer, by door: the headers that provoke it, its status, and its reason as the door spells it. */
const earlyAnswers = () =>
  [
    ["gateway", "401 (no key)", GATEWAY, json, 401, "UNAUTHENTICATED"],
    ["gateway", "413 (too large)", GATEWAY, { ...json, authorization: `Bearer ${apiKey}` }, 413, "PAYLOAD_TOO_LARGE"],
    ["gateway", "415 (not JSON)", GATEWAY, { "content-type": "text/plain", authorization: `Bearer ${apiKey}` }, 415, "UNSUPPORTED_MEDIA_TYPE"],
    ["Connect", "401 (no key)", CONNECT, json, 401, "unauthenticated"],
    ["Connect", "413 (too large)", CONNECT, { ...json, authorization: `Bearer ${apiKey}` }, 413, "resource_exhausted"],
    ["Connect", "415 (no protocol's content type)", CONNECT, { "content-type": "text/plain" }, 415, "invalid_argument"],
  ] as const;
/** The reason in a gateway envelope, or the code of Connect's error JSON. */
const reasonOf = (body: string) => {
  const parsed = JSON.parse(body) as { data?: { reason?: string }; code?: string | number };
  return parsed.data?.reason ?? parsed.code;
};
const MB = 1 << 20;

describe("an early answer over HTTP/1.1 reaches a client still sending a 1 MB chunked body", () => {
  it.each([
    ["fast, reading as it writes", { totalBytes: MB }],
    ["slowly, reading as it writes", { totalBytes: MB, paceMs: 2 }],
    ["fast, reading only after the last byte", { totalBytes: MB, readAfterWriting: true }],
  ] as const)("%s", async (_, options) => {
    for (const [door, what, path, headers, status, reason] of earlyAnswers()) {
      const sent = await sendChunked(port, path, headers, options);
      expect({ door, what, status: sent.status, reason: sent.body && reasonOf(sent.body), error: sent.error, sentBytes: sent.sentBytes }).toEqual({
        door,
        what,
        status,
        reason,
        error: undefined,
        sentBytes: MB,
      });
    }
  });

  it("a body that breaks off into garbage after the answer still leaves the answer readable (no reset)", async () => {
    for (const [door, what, path, headers, status] of earlyAnswers()) {
      const sent = await sendChunked(port, path, headers, { totalBytes: MB, breakAfterBytes: 256 * 1024, readAfterWriting: true });
      expect({ door, what, status: sent.status, whole: sent.body !== undefined }).toEqual({ door, what, status, whole: true });
    }
  });
});

describe("a client that keeps sending is cut off without holding the service", () => {
  const lingerTimeouts = async () => {
    const text = await (await fetch(`${service.url}/metrics`)).text();
    return Number(/^typesafe_connections_timed_out_total\{timeout="linger"\} (\d+)/m.exec(text)?.[1] ?? 0);
  };

  it("past the byte bound: answered, then closed; the service keeps serving", async () => {
    const sends = earlyAnswers().map(([, , path, headers]) => sendChunked(port, path, headers, { totalBytes: 64 * MB }));
    expect((await fetch(`${service.url}/healthz`)).status).toBe(200);
    for (const [[door, , , , status], sent] of earlyAnswers().map((c, i) => [c, sends[i]!] as const)) {
      const { status: got, body, sentBytes } = await sent;
      expect({ door, status: got, whole: body !== undefined }).toEqual({ door, status, whole: true });
      // Closed by the bound (16 times the 96 KB limit, and what was in flight), long before the client was done.
      expect(sentBytes).toBeLessThan(8 * MB);
    }
  });

  it("past the time bound: a slow sender gets its answer, then the connection closes after the linger time", async () => {
    const before = await lingerTimeouts();
    const sends = earlyAnswers()
      .filter(([, what]) => what.startsWith("401"))
      .map(([door, , path, headers, status]) => ({ door, status, sent: sendChunked(port, path, headers, { totalBytes: 1_000 * MB, paceMs: 20 }) }));
    for (const { door, status, sent } of sends) {
      const { status: got, body, closedAfterMs } = await sent;
      expect({ door, status: got, whole: body !== undefined }).toEqual({ door, status, whole: true });
      expect(closedAfterMs).toBeGreaterThanOrEqual(LINGER_MS);
    }
    expect(await lingerTimeouts()).toBe(before + sends.length);
    expect((await fetch(`${service.url}/healthz`)).status).toBe(200);
  });
});
