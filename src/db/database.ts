import knex, { type Knex } from "knex";
import pg from "pg";
import type { Logger } from "../logger.js";
import { parseDatabaseUrl, type TargetSessionAttrs } from "./connection-string.js";
import { migrate } from "./migrator.js";
import { primaryClientFor } from "./primary-client.js";

/** Callers that open a knex of their own migrate it with this. */
export { migrate };

// int8 (bigint) columns hold money in integer units, always below 2^53.
pg.types.setTypeParser(pg.types.builtins.INT8, (value) => Number(value));

export interface Database {
  db: Knex;
  /** Where the store is reachable, for the operator CLI ("embedded" or "external"). */
  kind: "embedded" | "external";
  close(): Promise<void>;
}

export interface DatabaseOptions {
  databaseUrl: string | undefined;
  dataDir: string;
  logger: Logger;
  /** Connections of the pool, to the server or to the embedded store's wire. */
  poolMax?: number;
}

/**
 * Opens the store and brings its schema up to date. With a DATABASE_URL it is
 * that PostgreSQL server; otherwise an embedded PGlite persisted in dataDir,
 * served on a loopback socket so that the same `pg` driver, dialect and
 * queries are used either way.
 */
export async function openDatabase(options: DatabaseOptions): Promise<Database> {
  if (options.databaseUrl) {
    const db = createKnex(options.databaseUrl, options.poolMax ?? 10, options.logger);
    await migrate(db, { useAdvisoryLock: true, logger: options.logger });
    return { db, kind: "external", close: () => db.destroy() };
  }
  const { openEmbeddedStore } = await import("./embedded.js");
  const store = await openEmbeddedStore(options.dataDir, options.logger);
  const db = createKnex(store.url, options.poolMax ?? 10, options.logger, "any");
  try {
    await migrate(db, { useAdvisoryLock: false, logger: options.logger });
  } catch (err) {
    await db.destroy();
    await store.close();
    throw err;
  }
  return {
    db,
    kind: "embedded",
    close: async () => {
      await db.destroy();
      await store.close();
    },
  };
}

/**
 * A knex instance on the pg driver. knex's own log lines go to the given
 * logger (stdout must stay clean for the CLI's JSON). The URL may list
 * several nodes (libpq's multi-host form); `target_session_attrs` defaults to
 * `read-write`, so a connection never lands on a standby. A single node asked
 * for with `any` (the embedded store) gets knex's own pg client, unchanged.
 */
export function createKnex(connectionString: string, poolMax: number, logger?: Logger, defaultTargetSessionAttrs: TargetSessionAttrs = "read-write"): Knex {
  const target = parseDatabaseUrl(connectionString, defaultTargetSessionAttrs);
  const plain = target.nodes.length === 1 && target.targetSessionAttrs === "any";
  const forward = (level: "warn" | "error") => (message: unknown) =>
    logger?.[level]("knex", { detail: message instanceof Error ? message.message : String(message) });
  return knex({
    log: { warn: forward("warn"), error: forward("error"), deprecate: () => {}, debug: () => {} },
    client: plain ? "pg" : primaryClientFor(target, logger),
    connection: {
      connectionString: target.nodes[0]!.url,
      application_name: "typesafe",
      // A partitioned client must never hold an account lock for long.
      statement_timeout: 10_000,
      idle_in_transaction_session_timeout: 10_000,
    } as Knex.PgConnectionConfig,
    pool: { min: 0, max: poolMax },
    acquireConnectionTimeout: 10_000,
  });
}
