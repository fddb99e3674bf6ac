import crypto from "node:crypto";
import net from "node:net";
import type { PGlite } from "@electric-sql/pglite";

/**
 * Serves one PGlite database over the PostgreSQL wire protocol on a loopback
 * port, so the ordinary `pg` driver (the service's pool, the operator CLI,
 * other test processes) can share it.
 *
 * PGlite has a single backend session. Clients are therefore given that
 * session one exchange at a time: a client's messages are gathered up to the
 * end of an exchange (Sync, a simple Query, or Flush), and the whole exchange
 * runs while the client holds the session; a client that leaves a transaction
 * open keeps the session until it commits or rolls back. Handing the session
 * over message by message — what @electric-sql/pglite-socket 0.2 does — lets
 * one client's Bind land on another's Parse under concurrency.
 *
 * Other local processes can reach a loopback port, so clients must send the
 * password of the URL (random per start, published only in files readable
 * by the owner), and a client idle inside a transaction for longer than
 * `idleInTransactionMs` is disconnected, as PostgreSQL's
 * idle_in_transaction_session_timeout does, so it cannot stall everyone else.
 */
export interface WireServer {
  url: string;
  close(): Promise<void>;
}

const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;
const CANCEL_REQUEST = 80877102;
const PASSWORD = "p";
/** AuthenticationCleartextPassword: 'R', length 8, code 3. */
const AUTHENTICATION_CLEARTEXT_PASSWORD = Buffer.from([0x52, 0, 0, 0, 8, 0, 0, 0, 3]);
const PASSWORD_FAILED = errorResponse("28P01", "password authentication failed");
/** Message types that end an exchange: Sync, Query, Flush. */
const EXCHANGE_END = new Set(["S", "Q", "H"]);
const TERMINATE = "X";

export interface WireOptions {
  host?: string;
  port?: number;
  idleInTransactionMs?: number;
}

export async function serveWire(db: PGlite, options: WireOptions = {}): Promise<WireServer> {
  const { host = "127.0.0.1", port = 0, idleInTransactionMs = 10_000 } = options;
  const password = crypto.randomBytes(24).toString("base64url");
  const session = createSessionLock();
  const sockets = new Set<net.Socket>();

  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.setNoDelay(true);
    const client = Symbol("client");
    let buffered: Buffer = Buffer.alloc(0);
    let phase: "startup" | "password" | "ready" = "startup";
    let startupMessage: Buffer | undefined;
    let exchange: Buffer[] = [];
    let queue = Promise.resolve();
    let idleTimer: NodeJS.Timeout | undefined;

    const answer = (chunk: Uint8Array) => {
      if (!socket.destroyed) socket.write(Buffer.from(chunk));
    };

    /** Runs messages in order; an exchange is run whole while this client holds the session. */
    const run = (messages: Buffer[]) => {
      clearTimeout(idleTimer);
      queue = queue
        .then(async () => {
        await session.acquire(client);
        // PGlite hands back each answer message on its own (ParseComplete, BindComplete, DataRow, …); the client
        // reads nothing before the exchange's end, so they leave in one write instead of one system call each.
        socket.cork();
        try {
          // PGlite is held for the whole exchange and syncs its files once, at the end, as its own query() does:
          // a hold and a sync per message made a query through the wire cost far more CPU than query() itself.
          await db.runExclusive(async () => {
            try {
              for (const message of messages) {
                if (socket.destroyed) break;
                await db.execProtocolRawStream(new Uint8Array(message), { syncToFs: false, onRawData: answer });
              }
            } finally {
              await db.syncToFs();
            }
          });
        } finally {
          socket.uncork();
          if (!db.isInTransaction()) session.release(client);
          else idleTimer = setTimeout(() => socket.destroy(), idleInTransactionMs);
        }
        })
        .catch(() => {
          socket.destroy();
        });
    };

    socket.on("data", (chunk: Buffer) => {
      buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk]);
      for (;;) {
        if (phase === "startup") {
          // Untyped messages: Int32 length, Int32 code.
          if (buffered.length < 8) return;
          const length = buffered.readInt32BE(0);
          if (buffered.length < length) return;
          const message = buffered.subarray(0, length);
          buffered = buffered.subarray(length);
          const code = message.readInt32BE(4);
          if (code === SSL_REQUEST || code === GSSENC_REQUEST) {
            socket.write("N");
          } else if (code === CANCEL_REQUEST) {
            socket.end();
            return;
          } else {
            // Ask for the password before PGlite sees the startup message.
            startupMessage = Buffer.from(message);
            phase = "password";
            socket.write(AUTHENTICATION_CLEARTEXT_PASSWORD);
          }
          continue;
        }
        // Typed messages: Byte1 type, Int32 length (counting itself).
        if (buffered.length < 5) return;
        const length = 1 + buffered.readInt32BE(1);
        if (buffered.length < length) return;
        const message = Buffer.from(buffered.subarray(0, length));
        buffered = buffered.subarray(length);
        const type = String.fromCharCode(message[0]!);
        if (type === TERMINATE) {
          socket.end();
          return;
        }
        if (phase === "password") {
          if (type !== PASSWORD || !sameSecret(message.subarray(5, message.length - 1).toString("utf8"), password)) {
            socket.end(PASSWORD_FAILED);
            return;
          }
          phase = "ready";
          run([startupMessage!]);
          continue;
        }
        exchange.push(message);
        if (EXCHANGE_END.has(type)) {
          run(exchange);
          exchange = [];
        }
      }
    });
    socket.on("error", () => socket.destroy());
    socket.on("close", () => {
      sockets.delete(socket);
      clearTimeout(idleTimer);
      // A client gone mid-transaction must not keep the session.
      queue = queue.then(async () => {
        if (session.owner !== client) return;
        try {
          if (db.isInTransaction()) await db.exec("ROLLBACK");
        } finally {
          session.release(client);
        }
      });
    });
  });

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve());
  });
  const address = server.address() as net.AddressInfo;
  return {
    url: `postgres://postgres:${password}@${address.address}:${address.port}/postgres?sslmode=disable`,
    close: async () => {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const socket of sockets) socket.destroy();
      await closed;
    },
  };
}

/** The single backend session, held by one client at a time, handed over in arrival order. */
function createSessionLock() {
  const waiting: { client: symbol; grant: () => void }[] = [];
  const lock = {
    owner: undefined as symbol | undefined,
    async acquire(client: symbol): Promise<void> {
      if (lock.owner === client) return;
      if (lock.owner === undefined) {
        lock.owner = client;
        return;
      }
      await new Promise<void>((grant) => waiting.push({ client, grant }));
    },
    release(client: symbol): void {
      if (lock.owner !== client) return;
      const next = waiting.shift();
      lock.owner = next?.client;
      next?.grant();
    },
  };
  return lock;
}

function sameSecret(given: string, expected: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && crypto.timingSafeEqual(a, b);
}

/** A FATAL ErrorResponse with an SQLSTATE code and a message. */
function errorResponse(sqlState: string, message: string): Buffer {
  const fields = Buffer.from(`SFATAL\0VFATAL\0C${sqlState}\0M${message}\0\0`, "utf8");
  const header = Buffer.alloc(5);
  header.write("E", 0);
  header.writeInt32BE(4 + fields.length, 1);
  return Buffer.concat([header, fields]);
}
