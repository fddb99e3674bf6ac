import type { Knex } from "knex";
import { runPooled, type PooledStatement } from "../db/pooled-statement.js";

/**
 * Typed wrappers over the metering functions the migrations define
 * (src/db/migrations: create_metering_functions, refuse_abandoned_admissions,
 * batch_metering_statements, record_account_after_resolve and, for admit and
 * resolve, their _v2 versions, which add a key's own limits): each call is one
 * round trip and one transaction, for one metered call or a batch of them.
 * The SQL's "resolve" is this module's finish: a settle or a release.
 * admit, finish, abandon and sweep run on a connection of the root knex's
 * pool (runPooled: the hot path skips knex's builder); grant takes
 * `Knex | Knex.Transaction` so a caller (the operator CLI) decides the
 * transaction. Amounts are integer units.
 */

export type Endpoint = "decide" | "search";
export type Funding = "free" | "paid";
export type RequestStatus = "active" | "settled" | "released" | "expired";

export interface AdmitInput {
  /** sha256 of the API key (hashApiKey). */
  keyHash: Buffer;
  endpoint: Endpoint;
  /** The maximum this call can cost; held until it finishes (settle or release). */
  reserveUnits: number;
  /** Decisions may be paid with a free request; search never is (enforced in SQL too). */
  freeAllowed: boolean;
  /** The hold is released by itself this long after admission. */
  leaseMs: number;
  idempotencyKey?: string;
  /** Hash of the request (endpoint and body): the same key with another body is a mismatch. */
  requestHash?: Buffer;
  /** Use this id for the request row (the caller's request id); generated otherwise. */
  requestId?: string;
  /** Test clock; the database clock when absent. */
  now?: Date;
  /** Client-side limit for the round trip (see runMoneyStatement). */
  timeoutMs?: number;
}

/** The knex clients whose hot-path statements are sent named, so prepared once per connection (prepareStatementsOn). */
const namingStatements = new WeakSet<object>();

/**
 * Names the hot path's statements on `db`: pg prepares each once per
 * connection and then sends only Bind/Execute, which saves PostgreSQL the
 * parse and plan of every call. Only on PostgreSQL proper: the embedded store's wire
 * connections share one PGlite session, where a second connection's prepare
 * of the same name fails; PGlite names itself in version().
 */
export async function prepareStatementsOn(db: Knex): Promise<void> {
  const { rows } = await db.raw<{ rows: Array<{ version: string }> }>("SELECT version() AS version");
  if (!isPGlite(rows[0]!.version)) namingStatements.add(db.client);
}

/** PGlite's version() reads "PostgreSQL 18.6 (PGlite 0.5.14) on wasm32-unknown-emscripten, …". */
export function isPGlite(version: string): boolean {
  return /\(PGlite /.test(version);
}

/**
 * A money-changing statement of the hot path, sent through pg on a pooled
 * connection (runPooled). With `timeoutMs`, a reply lost on a connection that
 * stays open ends as a StatementTimeoutError (the connection is then
 * discarded) instead of hanging the call. A timeout says nothing about whether
 * the statement committed: callers find out by asking again by request id.
 */
function runMoneyStatement<Row extends object>(db: Knex, statement: PooledStatement, values: unknown[], timeoutMs: number | undefined): Promise<Row[]> {
  return runPooled<Row>(db, namingStatements.has(db.client) ? statement : { text: statement.text }, values, timeoutMs);
}

/**
 * One call's admission. Calls in flight together go in one ADMIT_MANY
 * (migration 20261125120000_batch_metering_statements), whose batch costs
 * PostgreSQL more than this for a single call.
 */
const ADMIT: PooledStatement = {
  name: "metering_admit_v2",
  text:
    "SELECT admission.* FROM set_config('synchronous_commit', 'off', true) AS relaxed, " +
    "metering_admit_unless_abandoned_v2($1::bytea, $2::text, $3::bigint, $4::boolean, $5::integer, $6::text, $7::bytea, $8::timestamptz, $9::uuid) AS admission",
};

const ADMIT_MANY: PooledStatement = {
  name: "metering_admit_many_v2",
  text:
    "SELECT admission.* FROM set_config('synchronous_commit', 'off', true) AS relaxed, " +
    "metering_admit_many_v2($1::bytea[], $2::text[], $3::bigint[], $4::boolean[], $5::integer[], $6::text[], $7::bytea[], $8::timestamptz[], $9::uuid[]) AS admission",
};

/** Only after an admission's reply was lost: unnamed, like the sweep. It only releases, so the previous release's function serves. */
const ABANDON: PooledStatement = { text: "SELECT * FROM metering_abandon($1::uuid, $2::timestamptz)" };

/** Runs every few seconds, so it is not worth a prepared statement on each connection: unnamed. */
const SWEEP: PooledStatement = { text: "SELECT metering_sweep($1::timestamptz, $2::integer) AS expired" };

/** One finish (a settle or a release); several go in one FINISH_MANY, as admissions do. */
const FINISH: PooledStatement = {
  name: "metering_resolve_v2",
  text: "SELECT * FROM metering_resolve_v2($1::uuid, $2::boolean, $3::bigint, $4::jsonb, $5::timestamptz)",
};

const FINISH_MANY: PooledStatement = {
  name: "metering_resolve_many_v2",
  text: "SELECT * FROM metering_resolve_many_v2($1::uuid[], $2::boolean[], $3::bigint[], $4::jsonb[], $5::timestamptz[])",
};

/**
 * The hot path's statement texts, for `npm run bench:sql` and `bench:triggers`, which count what
 * PostgreSQL runs for them: the bench sends these very texts, so it cannot
 * drift from what the service sends.
 */
export const meteringStatements = { admit: ADMIT, admitMany: ADMIT_MANY, finish: FINISH, finishMany: FINISH_MANY } as const;

/** What the account looks like after the call, for billing fields and rate-limit headers. */
export interface AccountSnapshot {
  accountId: string;
  balanceUnits: number;
  availableUnits: number;
  freeRemaining: number;
  freeAvailable: number;
  rateLimit: number;
  rateRemaining: number;
  /** Time until the oldest admission in the window leaves it (a slot frees up). */
  rateResetMs: number;
  inFlight: number;
  maxInFlight: number;
}

/** A key's budget as the admission read it: the limit, its period, and what the current period spent and holds. */
export interface KeyBudgetSnapshot {
  keyId: string;
  budgetUnits: number;
  period: KeyBudgetPeriod;
  spentUnits: number;
  heldUnits: number;
}

export type KeyBudgetPeriod = "day" | "week" | "month" | "total";

export type Admission =
  | ({ outcome: "admitted"; requestId: string; funding: Funding; reservedUnits: number } & AccountSnapshot)
  | { outcome: "unauthenticated" }
  | { outcome: "key_expired"; keyId: string; expiredAt: Date }
  | { outcome: "key_scope_denied"; keyId: string }
  | ({ outcome: "key_rate_limited"; retryAfterMs: number } & AccountSnapshot)
  | ({ outcome: "key_budget_exceeded"; requiredUnits: number; budget: KeyBudgetSnapshot } & AccountSnapshot)
  | ({ outcome: "rate_limited"; retryAfterMs: number } & AccountSnapshot)
  | ({ outcome: "concurrency_limited"; retryAfterMs: number } & AccountSnapshot)
  | ({ outcome: "insufficient_balance"; requiredUnits: number } & AccountSnapshot)
  | ({ outcome: "idempotency_in_progress"; requestId: string } & AccountSnapshot)
  | ({ outcome: "idempotency_mismatch"; requestId: string } & AccountSnapshot)
  | ({
      outcome: "replay";
      requestId: string;
      funding: Funding;
      reservedUnits: number;
      chargedUnits: number;
      response: unknown;
    } & AccountSnapshot);

interface DbAdmissionRow {
  outcome: Admission["outcome"];
  request_id: string | null;
  account_id: string | null;
  funding: Funding | null;
  reserved: number | null;
  charged: number | null;
  required: number | null;
  balance: number | null;
  available: number | null;
  free_remaining: number | null;
  free_available: number | null;
  in_flight: number | null;
  max_in_flight: number | null;
  rate_limit: number | null;
  rate_remaining: number | null;
  rate_reset_ms: number | null;
  retry_after_ms: number | null;
  response: unknown;
  key_id: string | null;
  key_expires_at: Date | null;
  key_budget: number | null;
  key_budget_period: KeyBudgetPeriod | null;
  key_spent: number | null;
  key_held: number | null;
}

/**
 * Admission control in one round trip: 401 key → 403 scope → 429 rate (account, then key) →
 * 429 concurrency → 402 balance → 402 key budget, or a hold.
 *
 * The admission commits without waiting for its WAL flush (`synchronous_commit`
 * off for this transaction only), so a call waits for one disk flush, its
 * settle's, instead of two, which shortens the slowest calls under load. What
 * a database crash can lose is then an admission of the last moments before
 * it (PostgreSQL flushes such commits within three wal_writer_delay periods),
 * never a charge (test/metering/crash.test.ts crashes PostgreSQL mid-call):
 * - a settle commits durably, and its flush carries every earlier WAL record,
 *   so a settle that survives a crash brings its admission along;
 * - a lost hold makes its settle find nothing (`not_found`), and the meter
 *   withholds the answer and bills nothing, as for any hold that is gone;
 * - a lost free-request hold, rate-window entry or lease expiry only gives
 *   back what the crashed calls had reserved.
 */
export async function admit(db: Knex, input: AdmitInput): Promise<Admission> {
  return (await admitMany(db, [input], input.timeoutMs))[0]!;
}

/**
 * Admits several calls in one round trip and one transaction (createBatcher
 * groups concurrent calls); answers in the inputs' order. Each is decided as
 * admit decides it, in the order of their accounts' ids: calls of one account
 * see each other as consecutive single calls would. All or nothing: should
 * one raise, none is admitted.
 */
export async function admitMany(db: Knex, inputs: readonly AdmitInput[], timeoutMs: number | undefined): Promise<Admission[]> {
  const columns = [
    inputs.map((input) => input.keyHash),
    inputs.map((input) => input.endpoint),
    inputs.map((input) => input.reserveUnits),
    inputs.map((input) => input.freeAllowed),
    inputs.map((input) => Math.ceil(input.leaseMs)),
    inputs.map((input) => input.idempotencyKey ?? null),
    inputs.map((input) => input.requestHash ?? null),
    inputs.map((input) => input.now ?? null),
    inputs.map((input) => input.requestId ?? null),
  ];
  const rows =
    inputs.length === 1
      ? await runMoneyStatement<DbAdmissionRow>(db, ADMIT, columns.map((column) => column[0]), timeoutMs)
      : await runMoneyStatement<DbAdmissionRow>(db, ADMIT_MANY, columns, timeoutMs);
  return oneRowEach(rows, inputs).map(admissionOf);
}

function admissionOf(row: DbAdmissionRow): Admission {
  if (row.outcome === "unauthenticated") return { outcome: "unauthenticated" };
  if (row.outcome === "key_expired") return { outcome: row.outcome, keyId: present(row.key_id), expiredAt: present(row.key_expires_at) };
  if (row.outcome === "key_scope_denied") return { outcome: row.outcome, keyId: present(row.key_id) };
  const account: AccountSnapshot = {
    accountId: present(row.account_id),
    balanceUnits: present(row.balance),
    availableUnits: present(row.available),
    freeRemaining: present(row.free_remaining),
    freeAvailable: present(row.free_available),
    rateLimit: present(row.rate_limit),
    rateRemaining: present(row.rate_remaining),
    rateResetMs: present(row.rate_reset_ms),
    inFlight: present(row.in_flight),
    maxInFlight: present(row.max_in_flight),
  };
  switch (row.outcome) {
    case "admitted":
      return { outcome: row.outcome, requestId: present(row.request_id), funding: present(row.funding), reservedUnits: present(row.reserved), ...account };
    case "rate_limited":
    case "key_rate_limited":
    case "concurrency_limited":
      return { outcome: row.outcome, retryAfterMs: present(row.retry_after_ms), ...account };
    case "key_budget_exceeded":
      return {
        outcome: row.outcome,
        requiredUnits: present(row.required),
        budget: {
          keyId: present(row.key_id),
          budgetUnits: present(row.key_budget),
          period: present(row.key_budget_period),
          spentUnits: present(row.key_spent),
          heldUnits: present(row.key_held),
        },
        ...account,
      };
    case "insufficient_balance":
      return { outcome: row.outcome, requiredUnits: present(row.required), ...account };
    case "idempotency_in_progress":
    case "idempotency_mismatch":
      return { outcome: row.outcome, requestId: present(row.request_id), ...account };
    case "replay":
      return {
        outcome: row.outcome,
        requestId: present(row.request_id),
        funding: present(row.funding),
        reservedUnits: present(row.reserved),
        chargedUnits: present(row.charged),
        response: row.response,
        ...account,
      };
  }
}

export interface FinishInput {
  requestId: string;
  success: boolean;
  /** Actual cost; charged up to the reservation. Absent on a success: the reservation is charged. */
  actualUnits?: number;
  /** Stored for idempotent replay when the request carried an Idempotency-Key. */
  response?: unknown;
  now?: Date;
  /** Client-side limit for the round trip (see runMoneyStatement). */
  timeoutMs?: number;
}

export type FinishResult =
  | {
      /** settled: charged and released the rest; released: everything given back. */
      outcome: "settled" | "released";
      requestId: string;
      accountId: string;
      funding: Funding;
      reservedUnits: number;
      chargedUnits: number;
      /** The actual cost asked for exceeded the reservation and was capped. */
      capped: boolean;
      balanceUnits: number;
      availableUnits: number;
      freeRemaining: number;
      freeAvailable: number;
    }
  | {
      /**
       * Already settled, released or expired: nothing changed (a request finishes
       * at most once). The account figures are those its settle or release left,
       * so a retry whose first attempt committed reports that call's own outcome.
       */
      outcome: "not_active";
      requestId: string;
      accountId: string;
      status: RequestStatus;
      funding: Funding;
      reservedUnits: number;
      chargedUnits: number;
      balanceUnits: number;
      availableUnits: number;
      freeRemaining: number;
      freeAvailable: number;
    }
  | { outcome: "not_found"; requestId: string };

interface DbFinishRow {
  outcome: "settled" | "released" | "not_active" | "not_found";
  request_id: string;
  account_id: string | null;
  status: RequestStatus | null;
  funding: Funding | null;
  reserved: number | null;
  charged: number | null;
  requested_charge: number | null;
  balance: number | null;
  available: number | null;
  free_remaining: number | null;
  free_available: number | null;
}

/** Settles (success) or releases (failure) a hold; idempotent by request id. */
export async function finish(db: Knex, input: FinishInput): Promise<FinishResult> {
  return (await finishMany(db, [input], input.timeoutMs))[0]!;
}

/** Settles and releases several holds in one round trip and one transaction, as admitMany admits. */
export async function finishMany(db: Knex, inputs: readonly FinishInput[], timeoutMs: number | undefined): Promise<FinishResult[]> {
  const columns = [
    inputs.map((input) => input.requestId),
    inputs.map((input) => input.success),
    inputs.map((input) => input.actualUnits ?? null),
    inputs.map((input) => (input.response === undefined ? null : JSON.stringify(input.response))),
    inputs.map((input) => input.now ?? null),
  ];
  const rows =
    inputs.length === 1
      ? await runMoneyStatement<DbFinishRow>(db, FINISH, columns.map((column) => column[0]), timeoutMs)
      : await runMoneyStatement<DbFinishRow>(db, FINISH_MANY, columns, timeoutMs);
  return oneRowEach(rows, inputs).map((row, i) => finishResultOf(row, inputs[i]!.requestId));
}

/** The account as a settle left it, read back from its ledger entry (see settledFigures). */
const SETTLED_FIGURES: PooledStatement = {
  name: "metering_settled_figures",
  text:
    "SELECT balance_after, available_after, free_remaining_after, free_available_after FROM ledger " +
    "WHERE request_id = $1::uuid AND kind = 'settle' AND balance_after IS NOT NULL",
};

/**
 * The account figures a request's settle recorded on its ledger entry, so an
 * Idempotency-Key replay reports the account as the original call's own
 * settle left it, as the original answer did, not as later calls left it.
 * Undefined when the entry recorded none (settled before the figures were
 * recorded). A read through the ledger's index on request_id: no lock.
 */
export async function settledFigures(
  db: Knex,
  requestId: string,
  timeoutMs: number | undefined,
): Promise<Pick<AccountSnapshot, "balanceUnits" | "availableUnits" | "freeRemaining" | "freeAvailable"> | undefined> {
  const rows = await runMoneyStatement<{ balance_after: number; available_after: number; free_remaining_after: number; free_available_after: number }>(
    db,
    SETTLED_FIGURES,
    [requestId],
    timeoutMs,
  );
  const entry = rows[0];
  if (!entry) return undefined;
  return {
    balanceUnits: entry.balance_after,
    availableUnits: entry.available_after,
    freeRemaining: entry.free_remaining_after,
    freeAvailable: entry.free_available_after,
  };
}

export interface AbandonInput {
  /** The id the admission was sent with (AdmitInput.requestId). */
  requestId: string;
  now?: Date;
  /** Client-side limit for the round trip (see runMoneyStatement). */
  timeoutMs?: number;
}

/**
 * Gives up on an admission whose outcome is unknown (its reply was lost or
 * late): releases its hold if it committed, as finish with success false
 * does; otherwise (not_found) the admission, should it still arrive, rolls
 * itself back instead of holding until its lease. Idempotent by request id.
 */
export async function abandon(db: Knex, input: AbandonInput): Promise<FinishResult> {
  const rows = await runPooled<DbFinishRow>(db, ABANDON, [input.requestId, input.now ?? null], input.timeoutMs);
  return finishResultOf(onlyRow(rows), input.requestId);
}

function finishResultOf(row: DbFinishRow, requestId: string): FinishResult {
  if (row.outcome === "not_found") return { outcome: "not_found", requestId };
  const common = {
    requestId: row.request_id,
    accountId: present(row.account_id),
    funding: present(row.funding),
    reservedUnits: present(row.reserved),
    chargedUnits: present(row.charged),
    balanceUnits: present(row.balance),
    availableUnits: present(row.available),
    freeRemaining: present(row.free_remaining),
    freeAvailable: present(row.free_available),
  };
  if (row.outcome === "not_active") return { outcome: "not_active", status: present(row.status), ...common };
  const requested = row.requested_charge;
  return { outcome: row.outcome, capped: requested !== null && requested > common.reservedUnits && common.funding === "paid", ...common };
}

export interface SweepInput {
  /** Test clock; the database clock when absent. */
  now?: Date;
  /** At most this many accounts per sweep (default 1000). */
  maxAccounts?: number;
  /** Client-side limit for the round trip (see runMoneyStatement). */
  timeoutMs?: number;
}

/** Expires every hold whose lease has passed (up to maxAccounts accounts); returns how many. */
export async function sweep(db: Knex, input: SweepInput = {}): Promise<number> {
  const rows = await runPooled<{ expired: number }>(db, SWEEP, [input.now ?? null, input.maxAccounts ?? 1000], input.timeoutMs);
  return onlyRow(rows).expired;
}

export interface GrantInput {
  accountId: string;
  units: number;
  freeRequests: number;
  now?: Date;
}

export interface GrantResult {
  accountId: string;
  balanceUnits: number;
  reservedUnits: number;
  freeRemaining: number;
  freeReserved: number;
}

/** Adds credits and free requests with their ledger entries; undefined for an unknown account. */
export async function grant(db: Knex | Knex.Transaction, input: GrantInput): Promise<GrantResult | undefined> {
  const result = await db.raw<{
    rows: { id: string | null; balance: number; reserved: number; free_remaining: number; free_reserved: number }[];
  }>("SELECT id, balance, reserved, free_remaining, free_reserved FROM metering_grant(?::uuid, ?::bigint, ?::integer, ?::timestamptz)", [
    input.accountId,
    input.units,
    input.freeRequests,
    input.now ?? null,
  ]);
  const row = onlyRow(result.rows);
  if (row.id === null) return undefined;
  return {
    accountId: row.id,
    balanceUnits: row.balance,
    reservedUnits: row.reserved,
    freeRemaining: row.free_remaining,
    freeReserved: row.free_reserved,
  };
}

/** The rows of a batch statement: one per input, in the inputs' order. */
function oneRowEach<T>(rows: T[], inputs: readonly unknown[]): T[] {
  if (rows.length !== inputs.length) throw new Error(`a metering function returned ${rows.length} rows for ${inputs.length} inputs`);
  return rows;
}

/** The one row a metering function returns (SQL functions of a row type always return one). */
function onlyRow<T>(rows: T[]): T {
  const row = rows[0];
  if (row === undefined) throw new Error("a metering function returned no row");
  return row;
}

/** A column the metering function fills for this outcome: NULL there means the row and the code disagree. */
function present<T>(value: T | null): T {
  if (value === null) throw new Error("metering function returned an incomplete row");
  return value;
}
