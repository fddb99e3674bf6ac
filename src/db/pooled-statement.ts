import type { Knex } from "knex";
import type pg from "pg";
import { noteStatementFailure } from "./primary-client.js";

/**
 * A statement sent on a connection of knex's pool through `pg` itself, for the
 * metering hot path: its two statements skip knex's builder, binding rewrite
 * and runner, a visible share of the service's CPU per call under load.
 *
 * It keeps what knex's runner gives every other statement: the one pool and
 * its acquire timeout, knex's query events (the metrics time statements by
 * them), and a client-side deadline after which the connection is marked
 * disposed, so the pool destroys it instead of handing out a connection whose
 * reply may still arrive (what knex does on `.timeout()`).
 */
export interface PooledStatement {
  /** With a name, pg prepares the statement once per connection and then only binds it; without, it is sent unnamed. */
  name?: string;
  /** The SQL with $1…$n placeholders. */
  text: string;
}

/** A statement whose reply did not arrive in time: whether it committed is unknown. */
export class StatementTimeoutError extends Error {
  constructor(timeoutMs: number) {
    super(`statement timeout: the database did not answer within ${timeoutMs} ms`);
    this.name = "StatementTimeoutError";
  }
}

/** knex's pooled pg connection; knex's pool destroys one whose `__knex__disposed` is set. */
interface PooledConnection {
  query(config: pg.QueryConfig): Promise<pg.QueryResult>;
  __knex__disposed?: unknown;
}

/** What runPooled uses of knex's client (`Knex.client` is untyped). */
interface KnexPool {
  acquireConnection(): Promise<PooledConnection>;
  releaseConnection(connection: PooledConnection): Promise<void>;
  emit(event: "query" | "query-response" | "query-error", ...args: unknown[]): boolean;
}

let queryCount = 0;

/** Runs `statement` with `values`; `timeoutMs` is the client-side limit for the round trip (none when absent). */
export async function runPooled<Row extends pg.QueryResultRow>(
  db: Knex,
  statement: PooledStatement,
  values: unknown[],
  timeoutMs?: number,
): Promise<Row[]> {
  const client = db.client as KnexPool;
  const connection = await client.acquireConnection();
  // What knex's own query events carry that a listener may read: the query id (the metrics pair events by it) and the SQL.
  const event = { __knexQueryUid: `pooled-${++queryCount}`, sql: statement.text };
  client.emit("query", event);
  let timer: NodeJS.Timeout | undefined;
  try {
    const query = connection.query({ ...statement, values }) as Promise<pg.QueryResult<Row>>;
    const result =
      timeoutMs === undefined
        ? await query
        : await new Promise<pg.QueryResult<Row>>((resolve, reject) => {
            timer = setTimeout(() => {
              const err = new StatementTimeoutError(timeoutMs);
              connection.__knex__disposed = err;
              reject(err);
            }, timeoutMs);
            query.then(resolve, reject);
          });
    client.emit("query-response", result, event);
    return result.rows;
  } catch (err) {
    noteStatementFailure(db, connection, err);
    client.emit("query-error", err, event);
    throw err;
  } finally {
    clearTimeout(timer);
    await client.releaseConnection(connection);
  }
}
