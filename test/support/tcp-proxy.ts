import net from "node:net";

/**
 * What the proxy does with one chunk the client sent:
 *   pass          — forwards it and the reply;
 *   lose-request  — closes both sides before the server sees it (nothing ran);
 *   lose-reply    — forwards it, then discards the server's reply and closes
 *                   both sides: the server ran (and committed) the statement,
 *                   the client sees a lost connection;
 *   stall-reply   — forwards it, then discards every reply while the
 *                   connection stays open: the client hears nothing until its
 *                   own timeout.
 *   hold-request  — keeps it back, with the server's side of the connection
 *                   open even after the client gives up and closes, until
 *                   deliverHeld(): a statement that reaches the server late,
 *                   as one slowed by a busy server or a lock does.
 */
export type Fault = "pass" | "lose-request" | "lose-reply" | "stall-reply" | "hold-request";

export interface TcpProxy {
  /** host:port of the proxy's listening side. */
  port: number;
  /** How many of each fault were injected so far. */
  faults: Record<Exclude<Fault, "pass">, number>;
  /** Cuts every open connection now (a PostgreSQL restart, seen from the client). */
  cutAll(): void;
  /**
   * Sends the held requests to the server; resolves once the server has
   * answered each (the statement ran to its end), then closes those
   * connections. The answers go nowhere: their clients are gone.
   */
  deliverHeld(): Promise<void>;
  close(): Promise<void>;
}

/**
 * A loopback TCP proxy that injects the faults a network puts between the
 * service and PostgreSQL; `decide` picks a Fault for each chunk the client
 * sends. PostgreSQL sends a statement's reply only after it committed (the
 * implicit transaction ends at Sync, before ReadyForQuery is flushed), so a
 * lost or stalled first reply chunk is the lost reply of a committed statement.
 */
export async function startTcpProxy(
  target: { host: string; port: number },
  decide: (clientChunk: Buffer) => Fault = () => "pass",
): Promise<TcpProxy> {
  const sockets = new Set<net.Socket>();
  const faults = { "lose-request": 0, "lose-reply": 0, "stall-reply": 0, "hold-request": 0 };
  /** Held requests, each with a function that sends it and resolves when the server has answered. */
  const held = new Set<() => Promise<void>>();
  const server = net.createServer((client) => {
    const upstream = net.connect(target.port, target.host);
    sockets.add(client).add(upstream);
    let replyFault: Fault = "pass";
    let stalled = false;
    let holding = false;
    const closeBoth = () => {
      client.destroy();
      if (!holding) upstream.destroy();
    };
    client.on("data", (chunk: Buffer) => {
      const fault = decide(chunk);
      if (fault === "lose-request") {
        faults[fault]++;
        closeBoth();
        return;
      }
      if (fault === "hold-request") {
        faults[fault]++;
        holding = true;
        // Resolved by the server's answer, or by the connection's end (a cut, a database restart).
        const answered = new Promise<void>((resolve) => {
          upstream.once("data", resolve);
          upstream.once("close", resolve);
        }).then(() => {
          held.delete(deliver);
          holding = false;
          closeBoth();
        });
        const deliver = () => {
          held.delete(deliver);
          if (!upstream.destroyed) upstream.write(chunk);
          return answered;
        };
        held.add(deliver);
        return;
      }
      if (fault !== "pass") replyFault = fault;
      upstream.write(chunk);
    });
    upstream.on("data", (chunk: Buffer) => {
      if (stalled || holding) return;
      if (replyFault === "lose-reply") {
        faults[replyFault]++;
        closeBoth();
        return;
      }
      if (replyFault === "stall-reply") {
        faults[replyFault]++;
        stalled = true;
        return;
      }
      client.write(chunk);
    });
    for (const socket of [client, upstream]) {
      socket.on("error", closeBoth);
      socket.on("close", () => {
        sockets.delete(socket);
        closeBoth();
      });
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    faults,
    cutAll() {
      for (const socket of sockets) socket.destroy();
    },
    deliverHeld: async () => {
      await Promise.all([...held].map((deliver) => deliver()));
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

/** The proxy's URL for a database URL: same credentials and database, the proxy's address. */
export function proxiedUrl(databaseUrl: string, proxy: TcpProxy): string {
  const url = new URL(databaseUrl);
  url.hostname = "127.0.0.1";
  url.port = String(proxy.port);
  return url.toString();
}
