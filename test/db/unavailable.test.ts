import { describe, expect, it } from "vitest";
import { StatementTimeoutError } from "../../src/db/pooled-statement.js";
import { NoPrimaryError } from "../../src/db/primary-client.js";
import { isDatabaseUnavailable } from "../../src/db/unavailable.js";

/** An Error as pg or the server builds it: a message and, from the server, a SQLSTATE code. */
function pgError(message: string, code?: string): Error {
  return Object.assign(new Error(message), code === undefined ? {} : { code });
}

describe("isDatabaseUnavailable", () => {
  it.each([
    // node-postgres 8, lib/client.js: a connection that dies, and queries sent on it afterwards.
    ["Connection terminated unexpectedly", undefined],
    ["Connection terminated", undefined],
    ["Client has encountered a connection error and is not queryable", undefined],
    ["Client was closed and is not queryable", undefined],
    // pg-pool 3, index.js: no connection within connectionTimeoutMillis.
    ["timeout exceeded when trying to connect", undefined],
    ["Connection terminated due to connection timeout", undefined],
    // PostgreSQL's SQLSTATE classes 08 (connection), 57 (operator intervention: crash recovery, shutdown), 53 (resources).
    ["the database system is in recovery mode", "57P03"],
    ["terminating connection due to administrator command", "57P01"],
    ["sorry, too many clients already", "53300"],
    ["could not serialize access due to concurrent update", "40001"],
    // A demoted primary or a standby refusing writes (SQLSTATE 25006 read_only_sql_transaction), as PostgreSQL 15 words it.
    ["cannot execute SELECT FOR UPDATE in a read-only transaction", "25006"],
    ["cannot execute INSERT in a read-only transaction", "25006"],
    // Node's own socket errors.
    ["connect ECONNREFUSED 127.0.0.1:5432", "ECONNREFUSED"],
  ])("%s (%s) is the database, not the statement", (message, code) => {
    expect(isDatabaseUnavailable(pgError(message, code))).toBe(true);
  });

  it.each([
    ['duplicate key value violates unique constraint "api_keys_key_hash_key"', "23505"],
    ['new row for relation "accounts" violates check constraint', "23514"],
    ['syntax error at or near "SELEC"', "42601"],
    // Another class-25 state is the statement's own fault (25P02: a statement after an error in the same transaction).
    ["current transaction is aborted, commands ignored until end of transaction block", "25P02"],
    ["Cannot read properties of undefined (reading 'rows')", undefined],
  ])("%s (%s) is a bug, not an outage", (message, code) => {
    expect(isDatabaseUnavailable(pgError(message, code))).toBe(false);
  });

  it("a statement deadline is unavailable; a thrown non-error is not", () => {
    expect(isDatabaseUnavailable(new StatementTimeoutError(50))).toBe(true);
    expect(isDatabaseUnavailable(new NoPrimaryError(["127.0.0.1:5432: read-only"]))).toBe(true);
    expect(isDatabaseUnavailable("Connection terminated")).toBe(false);
  });
});
