import net from "node:net";
import { PGlite } from "@electric-sql/pglite";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { serveWire, type WireServer } from "../../src/db/pglite-wire.js";

/**
 * The embedded store's wire server: many `pg` clients share PGlite's single
 * session without their exchanges interleaving (pglite-socket 0.2 failed here
 * with "bind message supplies 1 parameters, but prepared statement requires 9").
 */
let db: PGlite;
let wire: WireServer;
beforeAll(async () => {
  db = await PGlite.create();
  wire = await serveWire(db, { idleInTransactionMs: 300 });
  await db.exec("CREATE TABLE t (id serial PRIMARY KEY, worker int NOT NULL)");
}, 60_000);
afterAll(async () => {
  await wire?.close();
  await db?.close();
});

describe("pglite wire server", () => {
  it("20 concurrent clients mixing parameterized queries and transactions get only their own answers", async () => {
    const pool = new pg.Pool({ connectionString: wire.url, max: 20 });
    const wrong: string[] = [];
    await Promise.all(
      Array.from({ length: 20 }, async (_, worker) => {
        for (let i = 0; i < 50; i++) {
          if (i % 10 === 0) {
            const client = await pool.connect();
            await client.query("BEGIN");
            await client.query("INSERT INTO t (worker) VALUES ($1)", [worker]);
            const { rows } = await client.query("SELECT count(*)::int AS n FROM t WHERE worker = $1", [worker]);
            if (rows[0].n !== i / 10 + 1) wrong.push(`worker ${worker} saw ${rows[0].n} rows in its transaction`);
            await client.query("COMMIT");
            client.release();
          } else {
            const { rows } = await pool.query("SELECT $1::int * 1000 + $2::int AS id, $3::text AS tag", [worker, i, `w${worker}`]);
            if (rows[0].id !== worker * 1000 + i || rows[0].tag !== `w${worker}`) wrong.push(`worker ${worker} got ${JSON.stringify(rows[0])}`);
          }
        }
      }),
    );
    await pool.end();
    expect(wrong).toEqual([]);
    expect((await db.query<{ n: number }>("SELECT count(*)::int AS n FROM t")).rows[0]!.n).toBe(100);
  });

  it("a client that disconnects inside a transaction rolls it back and frees the session", async () => {
    const leaver = new pg.Client({ connectionString: wire.url });
    leaver.on("error", () => {});
    await leaver.connect();
    await leaver.query("BEGIN");
    await leaver.query("INSERT INTO t (worker) VALUES (999)");
    // The other client waits for the session (even to connect) while the transaction is open.
    const other = new pg.Client({ connectionString: wire.url });
    const connected = other.connect();
    await leaver.end();
    await connected;
    expect((await other.query("SELECT count(*)::int AS n FROM t WHERE worker = 999")).rows[0].n).toBe(0);
    await other.end();
  });

  it.each([
    ["a wrong password", (url: URL) => (url.password = "guess")],
    ["no password", (url: URL) => (url.password = "")],
  ])("refuses %s before PGlite sees the connection", async (_name, spoil) => {
    const url = new URL(wire.url);
    spoil(url);
    const intruder = new pg.Client({ connectionString: url.toString() });
    await expect(intruder.connect()).rejects.toThrow(/password/);
  });

  it("disconnects a client idle inside a transaction, so others get the session back", async () => {
    const idler = new pg.Client({ connectionString: wire.url });
    const idlerGone = new Promise((resolve) => idler.on("error", resolve));
    await idler.connect();
    await idler.query("BEGIN");
    await idler.query("INSERT INTO t (worker) VALUES (777)");
    const other = new pg.Client({ connectionString: wire.url });
    await Promise.all([other.connect(), idlerGone]);
    expect((await other.query("SELECT count(*)::int AS n FROM t WHERE worker = 777")).rows[0].n).toBe(0);
    await other.end();
  });

  it("answers an exchange in one write, not one system call per answer message", async () => {
    const client = new pg.Client({ connectionString: wire.url });
    await client.connect();
    const queries = 50;
    // Counts what the sockets of this process hand to the kernel: the client's and the server's writes.
    const writes = vi.spyOn(net.Socket.prototype as unknown as { _write: () => void }, "_write");
    const gatheredWrites = vi.spyOn(net.Socket.prototype as unknown as { _writev: () => void }, "_writev");
    try {
      for (let i = 0; i < queries; i++) {
        // ParseComplete, BindComplete, RowDescription, DataRow, CommandComplete, ReadyForQuery: six answer messages.
        await client.query({ name: "one-row", text: "SELECT $1::int AS n, 'x'::text AS tag", values: [i] });
      }
      // One write by the client and one by the server per query; a write per answer message made several.
      expect(writes.mock.calls.length + gatheredWrites.mock.calls.length).toBeLessThanOrEqual(2 * queries);
    } finally {
      writes.mockRestore();
      gatheredWrites.mockRestore();
      await client.end();
    }
  });

  it("holds PGlite once per exchange and syncs its files once, at the exchange's end, not after every message", async () => {
    const client = new pg.Client({ connectionString: wire.url });
    await client.connect();
    const queries = 20;
    const holds = vi.spyOn(db, "runExclusive");
    const syncs = vi.spyOn(db, "syncToFs");
    try {
      for (let i = 0; i < queries; i++) {
        // Bind, Describe, Execute and Sync after the first Parse: four messages, one exchange.
        await client.query({ name: "one-int", text: "SELECT $1::int AS n", values: [i] });
      }
      // A hold and a sync per message made 80 of each for 20 queries.
      expect(holds.mock.calls).toHaveLength(queries);
      expect(syncs.mock.calls).toHaveLength(queries);
    } finally {
      holds.mockRestore();
      syncs.mockRestore();
      await client.end();
    }
  });
});
