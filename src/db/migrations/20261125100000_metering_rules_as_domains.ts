import type { Knex } from "knex";

/**
 * The metering tables' one-column rules (no negative amount or count, limits
 * above zero, the names an endpoint, funding, status or ledger entry may take)
 * move from CHECK constraints to domains. The rules stay the same; what
 * changes is their price on the hot path:
 * - PostgreSQL rebuilds a table's CHECK constraints from their stored text and
 *   plans them again in every INSERT and UPDATE statement (ExecRelCheck), and
 *   checks them all whatever columns the statement writes. An admit + settle
 *   pair writes these tables six times.
 * - A domain's rule is parsed once per session (the type cache) and checked
 *   only on the values a statement writes.
 * `npm run bench:sql` counts what a PostgreSQL backend spends per admit +
 * settle pair, and shows the domains cheaper. The rules that compare two
 * columns stay CHECK constraints, as they were.
 *
 * An array built from such a column is an array of its domain
 * (`array_agg(kind)` is `metering_entry_kind[]`): compare it with a text
 * array after a cast (`array_agg(kind::text)`).
 *
 * Changing a column to a domain with a rule rewrites its table under an
 * exclusive lock: on a large ledger, run this migration in a quiet moment.
 */
const DOMAINS = `
  CREATE DOMAIN metering_units AS bigint CONSTRAINT metering_units_not_negative CHECK (VALUE >= 0);
  CREATE DOMAIN metering_count AS integer CONSTRAINT metering_count_not_negative CHECK (VALUE >= 0);
  CREATE DOMAIN metering_limit AS integer CONSTRAINT metering_limit_positive CHECK (VALUE > 0);
  CREATE DOMAIN metering_endpoint AS text CONSTRAINT metering_endpoint_known CHECK (VALUE IN ('decide', 'search'));
  CREATE DOMAIN metering_funding AS text CONSTRAINT metering_funding_known CHECK (VALUE IN ('free', 'paid'));
  CREATE DOMAIN metering_status AS text CONSTRAINT metering_status_known CHECK (VALUE IN ('active', 'settled', 'released', 'expired'));
  CREATE DOMAIN metering_entry_kind AS text
    CONSTRAINT metering_entry_kind_known CHECK (VALUE IN ('grant', 'free_grant', 'hold', 'settle', 'release', 'expire'));
`;

/** A column, the domain that now holds its rule, and the CHECK constraint (its name and rule) it replaces. */
interface ColumnRule {
  table: string;
  column: string;
  domain: string;
  /** The column's type before, and the domain's base type. */
  base: string;
  constraint: string;
  rule: string;
}

const COLUMNS: ColumnRule[] = [
  { table: "accounts", column: "balance", domain: "metering_units", base: "bigint", constraint: "accounts_balance_check", rule: "balance >= 0" },
  { table: "accounts", column: "reserved", domain: "metering_units", base: "bigint", constraint: "accounts_reserved_check", rule: "reserved >= 0" },
  { table: "accounts", column: "free_remaining", domain: "metering_count", base: "integer", constraint: "accounts_free_remaining_check", rule: "free_remaining >= 0" },
  { table: "accounts", column: "free_reserved", domain: "metering_count", base: "integer", constraint: "accounts_free_reserved_check", rule: "free_reserved >= 0" },
  { table: "accounts", column: "in_flight", domain: "metering_count", base: "integer", constraint: "accounts_in_flight_check", rule: "in_flight >= 0" },
  { table: "accounts", column: "max_in_flight", domain: "metering_limit", base: "integer", constraint: "accounts_max_in_flight_check", rule: "max_in_flight > 0" },
  { table: "accounts", column: "rate_limit", domain: "metering_limit", base: "integer", constraint: "accounts_rate_limit_check", rule: "rate_limit > 0" },
  { table: "accounts", column: "rate_window_ms", domain: "metering_limit", base: "integer", constraint: "accounts_rate_window_ms_check", rule: "rate_window_ms > 0" },
  { table: "requests", column: "endpoint", domain: "metering_endpoint", base: "text", constraint: "requests_endpoint_check", rule: "endpoint IN ('decide', 'search')" },
  { table: "requests", column: "funding", domain: "metering_funding", base: "text", constraint: "requests_funding_check", rule: "funding IN ('free', 'paid')" },
  { table: "requests", column: "reserved", domain: "metering_units", base: "bigint", constraint: "requests_reserved_check", rule: "reserved >= 0" },
  { table: "requests", column: "charged", domain: "metering_units", base: "bigint", constraint: "requests_charged_check", rule: "charged >= 0" },
  {
    table: "requests",
    column: "status",
    domain: "metering_status",
    base: "text",
    constraint: "requests_status_check",
    rule: "status IN ('active', 'settled', 'released', 'expired')",
  },
  {
    table: "ledger",
    column: "kind",
    domain: "metering_entry_kind",
    base: "text",
    constraint: "ledger_kind_check",
    rule: "kind IN ('grant', 'free_grant', 'hold', 'settle', 'release', 'expire')",
  },
  { table: "ledger", column: "amount", domain: "metering_units", base: "bigint", constraint: "ledger_amount_check", rule: "amount >= 0" },
  { table: "ledger", column: "free_units", domain: "metering_count", base: "integer", constraint: "ledger_free_units_check", rule: "free_units >= 0" },
];

/** One ALTER TABLE per table, its clauses built from COLUMNS. */
function alterEachTable(clauses: (c: ColumnRule) => string[]): string {
  const tables = [...new Set(COLUMNS.map((c) => c.table))];
  return tables.map((table) => `ALTER TABLE ${table} ${COLUMNS.filter((c) => c.table === table).flatMap(clauses).join(", ")};`).join("\n");
}

export async function up(knex: Knex): Promise<void> {
  await knex.raw(DOMAINS + alterEachTable((c) => [`DROP CONSTRAINT ${c.constraint}`, `ALTER COLUMN ${c.column} TYPE ${c.domain}`]));
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(
    alterEachTable((c) => [`ALTER COLUMN ${c.column} TYPE ${c.base}`, `ADD CONSTRAINT ${c.constraint} CHECK (${c.rule})`]) +
      [...new Set(COLUMNS.map((c) => c.domain))].map((domain) => `DROP DOMAIN ${domain};`).join("\n"),
  );
}
