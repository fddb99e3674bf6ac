import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import type { ConnectRouter, Interceptor } from "@connectrpc/connect";
import type { ConnectionLimits } from "./config.js";
import { guardConnection, type ConnectionGuard } from "./connection-guard.js";
import type { Logger } from "./logger.js";
import type { Metrics } from "./metrics.js";
import { closeLingering } from "./http/body.js";
import { createRpcHandler, type RpcHandlerOptions } from "./rpc/adapter.js";

/** The HTTP/2 client preface starts with these bytes; no HTTP/1.1 method does. */
const H2_PREFACE_START = Buffer.from("PRI ");
/** After the grace period, aborted calls get this long to send their 503 before sockets are dropped. */
const ABORTED_ANSWER_MS = 1_000;

/** What the one service port serves, and the limits its connections live under. */
export interface ServerOptions {
  routes: (router: ConnectRouter) => void;
  /** Handles every path the router does not (the JSON gateway). */
  fallback: RpcHandlerOptions["fallback"];
  interceptors: Interceptor[];
  maxBodyBytes: number;
  /** Services whose calls need an API key (their body is not read without one). */
  keyedServices: ReadonlySet<string>;
  grpcShortPath?: boolean;
  /** Headers every answer to a path must carry, whichever handler writes it (errors included). */
  answerHeaders?: (path: string) => Readonly<Record<string, string>> | undefined;
  logger: Logger;
  /** Aborted when the grace period of a shutdown ends; the gateway listens to it too. */
  shutdown: AbortController;
  connections: ConnectionLimits;
  /** Counts open, timed-out and refused connections. */
  metrics?: Pick<Metrics, "observeOpenConnections" | "recordConnectionTimeout" | "recordConnectionRefused">;
}

/** A listening server: where it is, and how to stop it. */
export interface RunningServer {
  port: number;
  url: string;
  /** Stops accepting, lets in-flight calls finish within graceMs, then drops what is left. */
  close(graceMs: number): Promise<void>;
}

/**
 * One port for every client: a net.Server looks at the first bytes of each
 * connection and hands it to an HTTP/2 server (gRPC, Connect, gRPC-Web over
 * h2c with prior knowledge) or an HTTP/1.1 server (Connect, gRPC-Web, the
 * JSON gateway). Both use the same Connect handler. Node's `allowHTTP1` only
 * works with TLS, hence the sniffing. Every connection is guarded by the
 * timeouts of connection-guard.ts, and the front server refuses connections
 * beyond the cap at once, so a crowd of unfinished requests can neither hold
 * the port nor use up the process's file descriptors.
 */
export async function startServer(options: ServerOptions, host: string, port: number): Promise<RunningServer> {
  const { shutdown } = options;
  let closing = false;
  const rpcHandler = createRpcHandler({
    routes: options.routes,
    fallback: options.fallback,
    interceptors: options.interceptors,
    maxBodyBytes: options.maxBodyBytes,
    keyedServices: options.keyedServices,
    grpcShortPath: options.grpcShortPath,
    shutdownSignal: shutdown.signal,
    logger: options.logger,
  });
  const { answerHeaders } = options;
  const handler: typeof rpcHandler = answerHeaders
    ? (req, res) => {
        // Set before any handler writes: Node merges them into whatever head is written later.
        const headers = answerHeaders((req.url ?? "").split("?", 1)[0]!);
        if (headers) for (const [name, value] of Object.entries(headers)) res.setHeader(name, value);
        rpcHandler(req, res);
      }
    : rpcHandler;
  const { connections: limits, metrics } = options;
  const onTimeout = metrics ? metrics.recordConnectionTimeout.bind(metrics) : () => {};
  // Node's own keep-alive timer is off: the guard closes idle connections and counts them.
  // Clients that read the Keep-Alive hint (Node's agent, undici) retire a connection before the guard closes it idle.
  const keepAliveHint = limits.idleTimeoutMs >= 2_000 ? `timeout=${Math.floor(limits.idleTimeoutMs / 1000)}` : undefined;
  const http1 = http.createServer({ keepAliveTimeout: 0 }, (req, res) => {
    if (keepAliveHint && !closing) res.setHeader("keep-alive", keepAliveHint);
    handler(req, res);
  });
  const guards = new Map<net.Socket, ConnectionGuard>();
  http1.on("request", (req: http.IncomingMessage, res: http.ServerResponse) => {
    // While draining, keep-alive connections close after their current answer.
    if (closing) res.shouldKeepAlive = false;
    guards.get(req.socket)?.request(req, res);
  });
  const h2 = http2.createServer({}, handler);
  const sessions = new Set<http2.ServerHttp2Session>();
  /** The guard of the socket being handed to the HTTP/2 server, which creates its session synchronously. */
  let handingOver: ConnectionGuard | undefined;
  h2.on("session", (session) => {
    sessions.add(session);
    session.on("close", () => sessions.delete(session));
    handingOver?.session(session);
  });
  // A request that stops parsing may follow an answer its client has not read yet: close lingering, never reset.
  http1.on("clientError", (_err: Error, socket: net.Socket) => closeLingering(socket));
  h2.on("clientError", (_err: Error, socket: net.Socket) => socket.destroy());

  const front = net.createServer((socket) => {
    const guard = guardConnection(socket, limits, onTimeout);
    guards.set(socket, guard);
    socket.on("close", () => guards.delete(socket));
    socket.on("error", () => socket.destroy());
    let head = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      if (head.length < H2_PREFACE_START.length && H2_PREFACE_START.subarray(0, head.length).equals(head)) return;
      socket.off("data", onData);
      socket.pause();
      socket.unshift(head);
      if (head.subarray(0, H2_PREFACE_START.length).equals(H2_PREFACE_START)) {
        // The HTTP/2 session reads the bytes already buffered on the socket itself.
        handingOver = guard;
        h2.emit("connection", socket);
        handingOver = undefined;
      } else {
        guard.http1();
        http1.emit("connection", socket);
        socket.resume();
      }
    };
    socket.on("data", onData);
  });
  // Node closes a connection beyond the cap as soon as it is accepted, before any byte is read.
  front.maxConnections = limits.maxConnections;
  front.on("drop", () => metrics?.recordConnectionRefused());
  metrics?.observeOpenConnections(() => guards.size);

  await new Promise<void>((resolve, reject) => {
    front.once("error", reject);
    front.listen(port, host, () => resolve());
  });
  const address = front.address() as net.AddressInfo;
  const displayHost = address.family === "IPv6" ? `[${address.address}]` : address.address;

  return {
    port: address.port,
    url: `http://${displayHost}:${address.port}`,
    async close(graceMs) {
      closing = true;
      const closed = new Promise<void>((resolve) => front.close(() => resolve()));
      // Connections still being sniffed, or idle, close now; HTTP/2 sessions get GOAWAY and finish their streams.
      for (const guard of guards.values()) guard.drain();
      for (const session of sessions) session.close();
      let drop: NodeJS.Timeout | undefined;
      const deadline = setTimeout(() => {
        // Calls still running are aborted: they release their holds and answer 503; then the rest is dropped.
        shutdown.abort(new Error("server shutting down"));
        drop = setTimeout(() => {
          for (const socket of guards.keys()) socket.destroy();
        }, ABORTED_ANSWER_MS);
        drop.unref();
      }, graceMs);
      deadline.unref();
      await closed;
      clearTimeout(deadline);
      clearTimeout(drop);
      shutdown.abort(new Error("server shut down"));
    },
  };
}
