import http from "node:http";
import type { AddressInfo } from "node:net";

/** One request as the fake provider received it. */
export interface RecordedRequest {
  method: string;
  path: string;
  query: URLSearchParams;
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** What the fake answers: a status, headers and a body (objects are sent as JSON). */
export interface FakeReply {
  status?: number;
  headers?: Record<string, string>;
  body?: string | object;
  /** Answer after this many ms (simulated upstream latency). */
  delayMs?: number;
  /** Never answer; the connection is dropped when the server closes. */
  hang?: boolean;
}

export type FakeHandler = (request: RecordedRequest) => FakeReply;

export interface FakeProvider {
  /** Base URL, e.g. http://127.0.0.1:40123, for TYPESAFE_SEARCH_<ID>_URL. */
  url: string;
  /** Every request received, oldest first. */
  requests: RecordedRequest[];
  /** Requests whose client went away before the answer was sent (a straggler cut by its caller). */
  abandoned(): number;
  /** Resolves at the next abandoned request. */
  nextAbandon(): Promise<void>;
  /** Replaces the handler: the next requests get this answer. */
  reply(handler: FakeHandler | FakeReply): void;
  close(): Promise<void>;
}

/**
 * A real HTTP server on 127.0.0.1, port 0, standing in for one search
 * provider. Tests inspect `requests` to check the exact call the adapter
 * made, and swap the handler to replay another recorded answer.
 */
export async function startFakeProvider(handler: FakeHandler): Promise<FakeProvider> {
  let current: FakeHandler = handler;
  const requests: RecordedRequest[] = [];
  const timers = new Set<NodeJS.Timeout>();
  let abandoned = 0;
  let abandonWaiters: Array<() => void> = [];
  const server = http.createServer((req, res) => {
    res.on("close", () => {
      if (res.writableEnded) return;
      abandoned++;
      for (const wake of abandonWaiters.splice(0)) wake();
    });
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      const url = new URL(req.url ?? "/", "http://fake");
      const recorded: RecordedRequest = {
        method: req.method ?? "GET",
        path: url.pathname,
        query: url.searchParams,
        headers: req.headers,
        body: Buffer.concat(chunks).toString("utf8"),
      };
      requests.push(recorded);
      let reply: FakeReply;
      try {
        reply = current(recorded);
      } catch (err) {
        reply = { status: 500, body: `fake handler failed: ${String(err)}` };
      }
      if (reply.hang) return;
      const send = () => {
        if (res.destroyed) return;
        const isText = typeof reply.body === "string";
        const body = reply.body === undefined ? "" : isText ? (reply.body as string) : JSON.stringify(reply.body);
        res.writeHead(reply.status ?? 200, {
          "content-type": isText ? "text/plain; charset=utf-8" : "application/json; charset=utf-8",
          ...reply.headers,
        });
        res.end(body);
      };
      if (reply.delayMs) {
        const timer = setTimeout(() => {
          timers.delete(timer);
          send();
        }, reply.delayMs);
        timers.add(timer);
      } else send();
    });
  });
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    abandoned: () => abandoned,
    nextAbandon: () => new Promise<void>((resolve) => abandonWaiters.push(resolve)),
    reply(next) {
      current = typeof next === "function" ? next : () => next;
    },
    async close() {
      abandonWaiters = [];
      for (const timer of timers) clearTimeout(timer);
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
