import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import type { ConnectRouter, Interceptor } from "@connectrpc/connect";
import type { Logger } from "./logger.js";
import { createRpcHandler, type RpcHandlerOptions } from "./rpc/adapter.js";

/** The HTTP/2 client preface starts with these bytes; no HTTP/1.1 method does. */
const H2_PREFACE_START = Buffer.from("PRI ");
/** A connection that has not said which protocol it speaks by then is dropped. */
const SNIFF_TIMEOUT_MS = 10_000;
/** HTTP/1.1 request headers must arrive within this. */
const HEADERS_TIMEOUT_MS = 10_000;
/** After the grace period, aborted calls get this long to send their 503 before sockets are dropped. */
const ABORTED_ANSWER_MS = 1_000;

export interface ServerOptions {
  routes: (router: ConnectRouter) => void;
  /** Handles every path the router does not (the JSON gateway). */
  fallback: RpcHandlerOptions["fallback"];
  interceptors: Interceptor[];
  maxBodyBytes: number;
  /** Services whose calls need an API key (their body is not read without one). */
  keyedServices: ReadonlySet<string>;
  grpcShortPath?: boolean;
  logger: Logger;
  /** Aborted when the grace period of a shutdown ends; the gateway listens to it too. */
  shutdown: AbortController;
}

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
 * works with TLS, hence the sniffing.
 */
export async function startServer(options: ServerOptions, host: string, port: number): Promise<RunningServer> {
  const { shutdown } = options;
  let closing = false;
  const handler = createRpcHandler({
    routes: options.routes,
    fallback: options.fallback,
    interceptors: options.interceptors,
    maxBodyBytes: options.maxBodyBytes,
    keyedServices: options.keyedServices,
    grpcShortPath: options.grpcShortPath,
    shutdownSignal: shutdown.signal,
    logger: options.logger,
  });
  const http1 = http.createServer({ keepAliveTimeout: 5_000, headersTimeout: HEADERS_TIMEOUT_MS }, handler);
  // While draining, keep-alive connections close after their current answer.
  http1.on("request", (_req: http.IncomingMessage, res: http.ServerResponse) => {
    if (closing) res.shouldKeepAlive = false;
  });
  const h2 = http2.createServer({}, handler);
  const sockets = new Set<net.Socket>();
  /** Connections that have not yet sent enough bytes to choose HTTP/1.1 or HTTP/2. */
  const sniffing = new Set<net.Socket>();
  const sessions = new Set<http2.ServerHttp2Session>();
  h2.on("session", (session) => {
    sessions.add(session);
    session.on("close", () => sessions.delete(session));
  });
  for (const server of [http1, h2]) {
    server.on("clientError", (_err: Error, socket: net.Socket) => socket.destroy());
  }

  const front = net.createServer((socket) => {
    sockets.add(socket);
    sniffing.add(socket);
    socket.on("close", () => {
      sockets.delete(socket);
      sniffing.delete(socket);
    });
    socket.on("error", () => socket.destroy());
    socket.setTimeout(SNIFF_TIMEOUT_MS, () => socket.destroy());
    let head = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      if (head.length < H2_PREFACE_START.length && H2_PREFACE_START.subarray(0, head.length).equals(head)) return;
      socket.off("data", onData);
      sniffing.delete(socket);
      socket.setTimeout(0);
      socket.pause();
      socket.unshift(head);
      if (head.subarray(0, H2_PREFACE_START.length).equals(H2_PREFACE_START)) {
        // The HTTP/2 session reads the bytes already buffered on the socket itself.
        h2.emit("connection", socket);
      } else {
        http1.emit("connection", socket);
        socket.resume();
      }
    };
    socket.on("data", onData);
  });

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
      for (const socket of sniffing) socket.destroy();
      http1.close();
      http1.closeIdleConnections();
      for (const session of sessions) session.close();
      let drop: NodeJS.Timeout | undefined;
      const deadline = setTimeout(() => {
        // Calls still running are aborted: they release their holds and answer 503; then the rest is dropped.
        shutdown.abort(new Error("server shutting down"));
        drop = setTimeout(() => {
          for (const socket of sockets) socket.destroy();
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
