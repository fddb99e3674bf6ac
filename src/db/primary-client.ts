import type { Knex } from "knex";
import PgDialect from "knex/lib/dialects/postgres/index.js";
import type pg from "pg";
import type { Logger } from "../logger.js";
import type { DatabaseNode, DatabaseTarget } from "./connection-string.js";

/**
 * knex's PostgreSQL client, taught libpq's multi-host connection: every new
 * connection of the pool tries the nodes until one is of the kind the URL asks
 * for (`target_session_attrs`): with `read-write`, a node answering
 * `transaction_read_only = on` (a standby, a demoted primary) is closed and the
 * next one tried. Unlike libpq, the node that served last is tried first: after
 * a switch that finds the new primary at once instead of after every dead node.
 *
 * A node that stops being the primary is left without a restart: an error
 * saying it is read-only (SQLSTATE 25006), shutting down (57P01-57P03) or
 * unreachable marks the connection disposed, so the pool destroys it, and ends
 * the generation of connections it belonged to, so every idle connection to
 * that node fails validation on its next acquire and is replaced by one to
 * whichever node is then the primary. pg's named prepared statements live per
 * connection, so a connection to the new primary prepares them afresh.
 */
export interface PrimaryState {
  /** `host:port` of the node connections last reached; undefined before the first. */
  node: string | undefined;
  /** Times a new connection reached another node than the one before. */
  changes: number;
  /** Every node of the URL, in its order. */
  nodes: string[];
}

/** No node of the list could be used: each one's reason, in order. A store failure: callers answer 503. */
export class NoPrimaryError extends Error {
  constructor(readonly failures: string[]) {
    super(`no database node accepted a connection of the requested kind: ${failures.join("; ")}`);
    this.name = "NoPrimaryError";
  }
}

interface NodeConnection extends pg.Client {
  __knex__disposed?: unknown;
  __typesafeGeneration?: number;
}

/** How long one node may take to accept a connection before the next is tried (pg waits forever by default). */
const NODE_CONNECT_TIMEOUT_MS = 3_000;

/** SQLSTATEs after which a connection's node is not (or no longer) a usable primary. */
function isNodeLost(err: unknown): boolean {
  const code = (err as { code?: unknown } | undefined)?.code;
  return code === "25006" || code === "57P01" || code === "57P02" || code === "57P03" || (typeof code === "string" && code.startsWith("08"));
}

class PrimaryClient extends PgDialect {
  generation = 0;
  state: PrimaryState;
  constructor(
    config: Knex.Config,
    readonly target: DatabaseTarget,
    readonly log: Logger | undefined,
  ) {
    super(config);
    this.state = { node: undefined, changes: 0, nodes: target.nodes.map((n) => n.name) };
  }

  override async _acquireOnlyConnection(): Promise<pg.Client> {
    const generation = this.generation;
    const failures: string[] = [];
    for (const node of this.order()) {
      const connection = await this.open(node).catch((err: unknown) => {
        failures.push(`${node.name}: ${err instanceof Error ? err.message : String(err)}`);
        return undefined;
      });
      if (!connection) continue;
      if (this.target.targetSessionAttrs === "read-write") {
        const readOnly = await connection.query<{ transaction_read_only: string }>("SHOW transaction_read_only").then(
          (result) => result.rows[0]?.transaction_read_only === "on",
          (err: unknown) => err,
        );
        if (readOnly !== false) {
          failures.push(`${node.name}: ${readOnly === true ? "read-only" : readOnly instanceof Error ? readOnly.message : String(readOnly)}`);
          connection.end().catch(() => {});
          continue;
        }
      }
      (connection as NodeConnection).__typesafeGeneration = generation;
      this.reached(node);
      return connection;
    }
    throw new NoPrimaryError(failures);
  }

  override async _query(connection: pg.Client, obj: unknown): Promise<unknown> {
    try {
      return await super._query(connection, obj);
    } catch (err) {
      this.noteFailure(connection, err);
      throw err;
    }
  }

  override validateConnection(connection: pg.Client): boolean {
    return (connection as NodeConnection).__typesafeGeneration === this.generation;
  }

  /** After a statement failed on `connection`: drops it, and its node's other connections, when the node is lost. */
  noteFailure(connection: pg.Client, err: unknown): void {
    if (!isNodeLost(err)) return;
    const lost = connection as NodeConnection;
    lost.__knex__disposed ??= err;
    if (lost.__typesafeGeneration !== this.generation) return;
    this.generation++;
    this.log?.warn("database node lost; its connections are replaced", {
      node: this.state.node,
      sqlstate: (err as { code?: unknown }).code,
    });
  }

  /** The last node that served first, then the others in the URL's order. */
  private order(): DatabaseNode[] {
    const nodes = this.target.nodes;
    const last = nodes.findIndex((n) => n.name === this.state.node);
    return last <= 0 ? nodes : [nodes[last]!, ...nodes.filter((_, i) => i !== last)];
  }

  private async open(node: DatabaseNode): Promise<pg.Client> {
    try {
      return await this.openUrl(node.url);
    } catch (err) {
      // libpq's sslmode=prefer: a server without TLS is reached in plain text.
      if (node.plainUrl === undefined || !(err instanceof Error) || !/does not support SSL/i.test(err.message)) throw err;
      return this.openUrl(node.plainUrl);
    }
  }

  private async openUrl(url: string): Promise<pg.Client> {
    const settings: pg.ClientConfig = { ...this.connectionSettings, connectionString: url };
    if (this.target.nodes.length > 1) settings.connectionTimeoutMillis ??= NODE_CONNECT_TIMEOUT_MS;
    const connection = new this.driver.Client(settings) as NodeConnection;
    // What knex's own client does: a connection that failed or ended is never handed out again.
    connection.on("error", (err) => {
      connection.__knex__disposed = err;
    });
    connection.on("end", () => {
      connection.__knex__disposed ??= "Connection ended unexpectedly";
    });
    try {
      await connection.connect();
    } catch (err) {
      connection.end().catch(() => {});
      throw err;
    }
    return connection;
  }

  private reached(node: DatabaseNode): void {
    if (this.state.node === node.name) return;
    const previous = this.state.node;
    this.state.node = node.name;
    if (previous === undefined) {
      if (this.target.nodes.length > 1) this.log?.info("database primary found", { node: node.name });
      return;
    }
    this.state.changes++;
    this.log?.warn("database primary changed", { from: previous, to: node.name, changes: this.state.changes });
  }
}

/** The knex client class for `target`: knex instantiates it with the rest of its configuration. */
export function primaryClientFor(target: DatabaseTarget, logger: Logger | undefined): typeof Knex.Client {
  return class extends PrimaryClient {
    constructor(config: Knex.Config) {
      super(config, target, logger);
    }
  } as unknown as typeof Knex.Client;
}

/** The node this pool reaches and how often it changed; undefined for a pool not made by primaryClientFor. */
export function primaryStateOf(db: Knex): PrimaryState | undefined {
  return db.client instanceof PrimaryClient ? db.client.state : undefined;
}

/** Tells the pool that a statement sent outside knex's runner failed on `connection`. */
export function noteStatementFailure(db: Knex, connection: unknown, err: unknown): void {
  if (db.client instanceof PrimaryClient) db.client.noteFailure(connection as pg.Client, err);
}

/**
 * Readiness: true when a pooled connection reaches a node that accepts writes
 * (always true for `any`). A read-only answer drops that node's connections.
 */
export async function reachesWritableNode(db: Knex): Promise<boolean> {
  if (!(db.client instanceof PrimaryClient) || db.client.target.targetSessionAttrs === "any") {
    await db.raw("SELECT 1");
    return true;
  }
  const client = db.client;
  const connection = (await client.acquireConnection()) as pg.Client;
  try {
    const result = await connection.query<{ transaction_read_only: string }>("SHOW transaction_read_only");
    if (result.rows[0]?.transaction_read_only !== "on") return true;
    client.noteFailure(connection, Object.assign(new Error("the node answers read-only"), { code: "25006" }));
    return false;
  } catch (err) {
    client.noteFailure(connection, err);
    throw err;
  } finally {
    await client.releaseConnection(connection);
  }
}
