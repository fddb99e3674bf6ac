import { StatementTimeoutError } from "./pooled-statement.js";
import { NoPrimaryError } from "./primary-client.js";

/**
 * True for failures of the database rather than of the statement: lost or
 * refused connections, pool timeouts, server shutdown, statement timeouts,
 * resource exhaustion, and a node that is (or just turned) read-only during a
 * failover (SQLSTATE 25006) or no node accepting writes at all. Those become
 * UNAVAILABLE (503); anything else is a bug.
 */
export function isDatabaseUnavailable(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const code = (err as { code?: unknown }).code;
  if (typeof code === "string") {
    if (/^E[A-Z]+$/.test(code)) return true; // a Node system error: ECONNREFUSED, ECONNRESET, EPIPE...
    if (code === "25006") return true;
    if (/^[0-9A-Z]{5}$/.test(code)) return ["08", "40", "53", "57", "58"].includes(code.slice(0, 2));
  }
  return err instanceof StatementTimeoutError || err instanceof NoPrimaryError || err.name === "KnexTimeoutError" || /connection terminated|not queryable|timeout exceeded when trying to connect|connection.*(ended|closed)|unable to acquire a connection/i.test(err.message);
}
