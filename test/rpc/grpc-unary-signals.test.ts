import { getEventListeners } from "node:events";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, expect, it } from "vitest";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../../src/gen/grpc/health/v1/health_pb.js";
import { loadConfig } from "../../src/config.js";
import { createLogger } from "../../src/logger.js";
import { registerHealth } from "../../src/rpc/health.js";
import { startServer, type RunningServer } from "../../src/server.js";
import { waitFor } from "../support/wait.js";

/**
 * Every unary gRPC call on the short path (src/rpc/grpc-unary.ts) listens to
 * the server's shutdown signal through its handler context, so that the end of
 * a shutdown's grace period cuts it off (test/metering/shutdown.test.ts). The
 * listener must go when the call ends (the context's abort at the end of the
 * call removes it): the signal lives as long as the server, and a listener
 * left per call would keep every finished call's objects alive. A call that
 * arrives once the signal has fired starts cut off, and every call's signal
 * fires when it completes, as Connect's HandlerContext documents.
 */
/** Whether each call's signal was already aborted when the interceptors saw it, and the signal itself. */
const abortedOnArrival: boolean[] = [];
const signals: AbortSignal[] = [];
const recordSignal: Interceptor = (next) => (req) => {
  abortedOnArrival.push(req.signal.aborted);
  signals.push(req.signal);
  return next(req);
};

const startHealthServer = (shutdown: AbortController) =>
  startServer(
    {
      routes: (router) => registerHealth(router, async () => true),
      fallback: (_req, res) => res.writeHead(404).end(),
      interceptors: [recordSignal],
      maxBodyBytes: 1_000_000,
      keyedServices: new Set(),
      logger: createLogger("silent"),
      shutdown,
      connections: loadConfig({}).connections,
    },
    "127.0.0.1",
    0,
  );

let server: RunningServer;
const shutdown = new AbortController();

beforeAll(async () => {
  server = await startHealthServer(shutdown);
});
afterAll(async () => {
  await server?.close(100);
});

it("a finished gRPC call leaves no listener on the shutdown signal", async () => {
  const before = getEventListeners(shutdown.signal, "abort").length;
  const client = createClient(Health, createGrpcTransport({ baseUrl: server.url }));
  const answers = await Promise.all(Array.from({ length: 20 }, () => client.check({ service: "" })));
  expect(answers.map((a) => a.status)).toEqual(Array(20).fill(ServingStatus.SERVING));
  expect(abortedOnArrival.splice(0)).toEqual(Array(20).fill(false));
  // Connect's HandlerContext: the signal also fires "when the RPC is completed without error".
  expect(signals.splice(0).map((signal) => signal.aborted)).toEqual(Array(20).fill(true));
  // The server sees a stream close just after its answer went out.
  await waitFor(() => getEventListeners(shutdown.signal, "abort").length === before, "the calls' shutdown listeners to go");
});

it("a call that arrives after the shutdown's grace period ended starts with its signal aborted", async () => {
  const ended = new AbortController();
  ended.abort(new Error("server shutting down"));
  const late = await startHealthServer(ended);
  try {
    const client = createClient(Health, createGrpcTransport({ baseUrl: late.url }));
    await client.check({ service: "" });
    expect(abortedOnArrival.splice(0)).toEqual([true]);
    signals.splice(0);
  } finally {
    await late.close(100);
  }
});
