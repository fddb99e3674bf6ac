import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import type { ConnectRouter, Interceptor } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";

/** A real h2c server on an ephemeral port, as gRPC clients and `buf curl` reach the real one. */
export interface H2cServer {
  baseUrl: string;
  close(): Promise<void>;
}

/** Starts `routes` on 127.0.0.1:0; close() also ends client sessions so tests never hang on them. */
export async function startH2cServer(
  routes: (router: ConnectRouter) => void,
  interceptors: Interceptor[] = [],
): Promise<H2cServer> {
  const server = http2.createServer(connectNodeAdapter({ routes, interceptors }));
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (session) => {
    sessions.add(session);
    session.on("close", () => sessions.delete(session));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    baseUrl: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve, reject) => {
        for (const session of sessions) session.close();
        server.close((err) => (err ? reject(err) : resolve()));
      }),
  };
}
