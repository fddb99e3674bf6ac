import { afterAll, beforeAll, describe, expect, it } from "vitest";
import pg from "pg";
import { createKnex } from "../../src/db/database.js";
import { runPooled } from "../../src/db/pooled-statement.js";
import { primaryStateOf, reachesWritableNode } from "../../src/db/primary-client.js";
import { isDatabaseUnavailable } from "../../src/db/unavailable.js";
import { startPrivateCluster, type PrivateCluster } from "../support/private-cluster.js";

/**
 * Two real PostgreSQL servers stand for two nodes of a formation; a node is
 * made a "standby" the way a read-only node answers libpq's check:
 * `default_transaction_read_only = on`, set with ALTER SYSTEM and a reload,
 * which also turns the sessions already open read-only (SQLSTATE 25006 on
 * their next write), as a demoted primary's sessions are.
 */
let a: PrivateCluster;
let b: PrivateCluster;

async function setReadOnly(cluster: PrivateCluster, readOnly: boolean): Promise<void> {
  const client = new pg.Client({ connectionString: cluster.url });
  await client.connect();
  try {
    await client.query(`ALTER SYSTEM SET default_transaction_read_only = ${readOnly ? "on" : "off"}`);
    await client.query("SELECT pg_reload_conf()");
  } finally {
    await client.end();
  }
}

function hostPort(url: string): string {
  return new URL(url).host;
}

beforeAll(async () => {
  [a, b] = await Promise.all([startPrivateCluster(), startPrivateCluster()]);
  for (const cluster of [a, b]) {
    const client = new pg.Client({ connectionString: cluster.url });
    await client.connect();
    await client.query("CREATE TABLE marks (node text)");
    await client.end();
  }
}, 60_000);

afterAll(() => {
  a?.stop();
  b?.stop();
});

describe("a pool on a multi-host URL follows the primary", () => {
  it("skips a read-only node, moves on when its node turns read-only, and is unready while none accepts writes", async () => {
    await setReadOnly(a, true);
    const url = `postgres://postgres@${hostPort(a.url)},${hostPort(b.url)}/postgres?target_session_attrs=read-write`;
    const db = createKnex(url, 3);
    try {
      // A (listed first) answers read-only: every connection lands on B.
      await Promise.all([1, 2, 3].map(() => db.raw("INSERT INTO marks VALUES ('b')")));
      expect(primaryStateOf(db)).toEqual({ node: hostPort(b.url), changes: 0, nodes: [hostPort(a.url), hostPort(b.url)] });
      expect(await reachesWritableNode(db)).toBe(true);

      // The switch: B turns read-only with its connections open, A takes writes.
      await setReadOnly(b, true);
      await setReadOnly(a, false);
      const failed = await db.raw("INSERT INTO marks VALUES ('?')").catch((err: unknown) => err);
      expect((failed as { code?: string }).code).toBe("25006");
      expect(isDatabaseUnavailable(failed)).toBe(true);
      // No restart: the next statements, on connections knex or the metering path take from the pool, reach A.
      await db.raw("INSERT INTO marks VALUES ('a')");
      await runPooled(db, { name: "mark", text: "INSERT INTO marks VALUES ($1)" }, ["a"]);
      await Promise.all([1, 2, 3].map(() => db.raw("INSERT INTO marks VALUES ('a')")));
      expect(primaryStateOf(db)).toMatchObject({ node: hostPort(a.url), changes: 1 });

      // Neither node accepts writes: not ready, and a statement fails as a store failure (503), not a bug.
      await setReadOnly(a, true);
      expect(await reachesWritableNode(db)).toBe(false);
      const none = await db.raw("INSERT INTO marks VALUES ('?')").catch((err: unknown) => err);
      expect(isDatabaseUnavailable(none)).toBe(true);
      expect((none as Error).message).toMatch(/read-only/);

      // A primary again (B): ready, and the named statement is prepared afresh on the new node's connection.
      await setReadOnly(b, false);
      expect(await reachesWritableNode(db)).toBe(true);
      await runPooled(db, { name: "mark", text: "INSERT INTO marks VALUES ($1)" }, ["b"]);
      expect(primaryStateOf(db)).toMatchObject({ node: hostPort(b.url), changes: 2 });
    } finally {
      await db.destroy();
    }
    const counts = await Promise.all(
      [a, b].map(async (cluster) => {
        const client = new pg.Client({ connectionString: cluster.url });
        await client.connect();
        const { rows } = await client.query<{ node: string; n: string }>("SELECT node, count(*) AS n FROM marks GROUP BY node ORDER BY node");
        await client.end();
        return rows.map((r) => `${r.node}:${r.n}`);
      }),
    );
    // Every write landed on the node that was the primary at the time, none on a read-only one.
    expect(counts).toEqual([["a:5"], ["b:4"]]);
  }, 60_000);

  it("a node that refuses connections is passed over to the next; sslmode=prefer reaches a server without TLS, as libpq does", async () => {
    await setReadOnly(a, false);
    const db = createKnex(`postgres://postgres@127.0.0.1:1,${hostPort(a.url)}/postgres?sslmode=prefer`, 1);
    try {
      expect((await db.raw("SELECT 1 AS one")).rows).toEqual([{ one: 1 }]);
      expect(primaryStateOf(db)?.node).toBe(hostPort(a.url));
    } finally {
      await db.destroy();
    }
  }, 30_000);
});
