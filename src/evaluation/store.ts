import type { Knex } from "knex";
import { finishExampleHold } from "../metering/evaluation-holds.js";
import { recordActivity, SYSTEM } from "../team/activity.js";
import { unitsToCredits } from "../units.js";
import type { ValidExample } from "./examples.js";

/**
 * The evaluations' rows (migration create_evaluations). Each operation takes
 * `db: Knex | Knex.Transaction`, so the caller decides the transaction; every
 * read and change of the account area is filtered by the account in SQL.
 * Times of leases and rates are the database's clock, one for every replica.
 */

export const EVALUATION_STATES = ["running", "stopped", "cancelled", "finished"] as const;
export type EvaluationState = (typeof EVALUATION_STATES)[number];
/** Why an evaluation stopped by itself; a member resumes it. */
export type StopReason = "INSUFFICIENT_BALANCE" | "CREDIT_CAP";

export interface DbEvaluationRow {
  id: string;
  account_id: string;
  name: string;
  questions: Record<string, unknown>;
  question_keys: string[];
  state: EvaluationState;
  stop_reason: string;
  cap_units: number;
  charged_units: number;
  held_units: number;
  examples_in_flight: number;
  total: number;
  done: number;
  failed: number;
  created_by: string;
  created_at: Date;
  running_since: Date;
  finished_at: Date | null;
}

/** An evaluation with its rate over the last minute of work. */
export interface EvaluationView extends DbEvaluationRow {
  examplesPerSecond: number;
}

export interface NewEvaluation {
  accountId: string;
  name: string;
  /** Question key -> the question's JSON as a decision takes it. */
  questions: Record<string, unknown>;
  questionKeys: string[];
  capUnits: number;
  examplesInFlight: number;
  createdBy: string;
  examples: readonly ValidExample[];
}

const INSERT_CHUNK = 500;

/** Stores an evaluation and all its examples in one transaction: all or nothing. */
export async function insertEvaluation(db: Knex, input: NewEvaluation): Promise<DbEvaluationRow> {
  return db.transaction(async (tx) => {
    const [row] = await tx("evaluations")
      .insert({
        account_id: input.accountId,
        name: input.name,
        questions: JSON.stringify(input.questions),
        question_keys: input.questionKeys,
        cap_units: input.capUnits,
        examples_in_flight: input.examplesInFlight,
        total: input.examples.length,
        created_by: input.createdBy,
      })
      .returning("*");
    for (let i = 0; i < input.examples.length; i += INSERT_CHUNK) {
      await tx("evaluation_examples").insert(
        input.examples.slice(i, i + INSERT_CHUNK).map((e) => ({
          evaluation_id: row.id,
          position: e.position,
          state: e.state,
          labels: JSON.stringify(e.labels),
        })),
      );
    }
    return normalize(row);
  });
}

/** The rate of the last minute of work (since it last started running, when that is later). */
const RATE_SQL = `
  (SELECT count(*) FROM evaluation_examples x
    WHERE x.evaluation_id = e.id AND x.finished_at > greatest(clock_timestamp() - interval '60 seconds', e.running_since))::float8
  / greatest(1, extract(epoch FROM clock_timestamp() - greatest(clock_timestamp() - interval '60 seconds', e.running_since)))::float8
  AS examples_per_second`;

export async function findEvaluation(db: Knex | Knex.Transaction, accountId: string, id: string): Promise<EvaluationView | undefined> {
  const { rows } = await db.raw<{ rows: Array<DbEvaluationRow & { examples_per_second: number }> }>(
    `SELECT e.*, ${RATE_SQL} FROM evaluations e WHERE e.account_id = ? AND e.id = ?`,
    [accountId, id],
  );
  return rows[0] ? viewOf(rows[0]) : undefined;
}

/** Where a page of evaluations starts: after this one (exclusive), newest first. */
export interface EvaluationCursor {
  createdAt: Date;
  id: string;
}

export async function listEvaluations(db: Knex | Knex.Transaction, accountId: string, limit: number, after?: EvaluationCursor): Promise<EvaluationView[]> {
  const { rows } = await db.raw<{ rows: Array<DbEvaluationRow & { examples_per_second: number }> }>(
    `SELECT e.*, ${RATE_SQL} FROM evaluations e
      WHERE e.account_id = ? AND (?::timestamptz IS NULL OR (e.created_at, e.id) < (?::timestamptz, ?::uuid))
      ORDER BY e.created_at DESC, e.id DESC LIMIT ?`,
    [accountId, after?.createdAt ?? null, after?.createdAt ?? null, after?.id ?? null, limit],
  );
  return rows.map(viewOf);
}

/** Cancels a running or stopped evaluation; undefined when it is not found. Examples in flight finish and are charged. */
export async function cancelEvaluation(db: Knex | Knex.Transaction, accountId: string, id: string): Promise<{ row?: DbEvaluationRow; changed: boolean }> {
  const [row] = await db("evaluations")
    .where({ account_id: accountId, id })
    .whereIn("state", ["running", "stopped"])
    .update({ state: "cancelled", stop_reason: "", finished_at: db.raw("clock_timestamp()") })
    .returning("*");
  if (row) return { row: normalize(row), changed: true };
  const current = await db("evaluations").where({ account_id: accountId, id }).first();
  return { row: current ? normalize(current) : undefined, changed: false };
}

/** Runs a stopped evaluation again, with a new cap when given. */
export async function resumeEvaluation(db: Knex | Knex.Transaction, accountId: string, id: string, capUnits: number | undefined): Promise<{ row?: DbEvaluationRow; changed: boolean }> {
  const [row] = await db("evaluations")
    .where({ account_id: accountId, id, state: "stopped" })
    .update({ state: "running", stop_reason: "", running_since: db.raw("clock_timestamp()"), ...(capUnits !== undefined ? { cap_units: capUnits } : {}) })
    .returning("*");
  if (row) return { row: normalize(row), changed: true };
  const current = await db("evaluations").where({ account_id: accountId, id }).first();
  return { row: current ? normalize(current) : undefined, changed: false };
}

/**
 * Deletes an evaluation that is not running and has no example in flight
 * (whose hold is still open); its charges stay in requests and the ledger.
 */
export async function deleteEvaluation(db: Knex | Knex.Transaction, accountId: string, id: string): Promise<"deleted" | "not_found" | "busy"> {
  return db.transaction(async (tx) => {
    const row = await tx("evaluations").where({ account_id: accountId, id }).forUpdate().first("state");
    if (!row) return "not_found";
    const inFlight = await tx("evaluation_examples").where({ evaluation_id: id, status: "running" }).first("position");
    if (row.state === "running" || inFlight) return "busy";
    await tx("evaluations").where({ id }).delete();
    return "deleted";
  });
}

/** An example taken by a replica, with what running it needs. */
export interface ClaimedExample {
  evaluationId: string;
  accountId: string;
  position: number;
  state: unknown;
  labels: Record<string, boolean | string>;
  questions: Record<string, unknown>;
  requestId: string;
  attempts: number;
  leaseToken: string;
}

/**
 * Takes up to `max` examples to run, oldest running evaluation first, each
 * evaluation no more than its examples in flight: an example that is pending,
 * or running under a lease that has passed (its replica died). The example
 * keeps the hold of an earlier attempt (request_id), so whoever finishes it
 * settles that hold and no other. The evaluation's row lock serializes the
 * count of its examples in flight between replicas.
 */
export async function claimExamples(db: Knex, input: { max: number; leaseMs: number; token: string }): Promise<ClaimedExample[]> {
  if (input.max <= 0) return [];
  const running = await db("evaluations").where({ state: "running" }).orderBy("running_since").limit(50).select("id");
  const claimed: ClaimedExample[] = [];
  for (const { id } of running as Array<{ id: string }>) {
    if (claimed.length >= input.max) break;
    const taken = await db.transaction(async (tx) => {
      const e = await tx("evaluations").where({ id, state: "running" }).forUpdate().first("account_id", "questions", "examples_in_flight");
      if (!e) return [];
      const { rows: live } = await tx.raw<{ rows: Array<{ n: number }> }>(
        "SELECT count(*)::int AS n FROM evaluation_examples WHERE evaluation_id = ? AND status = 'running' AND lease_until > clock_timestamp()",
        [id],
      );
      const free = Math.min(e.examples_in_flight - live[0]!.n, input.max - claimed.length);
      if (free <= 0) return [];
      const { rows } = await tx.raw<{ rows: Array<{ position: number; state: unknown; labels: Record<string, boolean | string>; request_id: string; attempts: number }> }>(
        // Materialized: a subquery under IN may be run again by the plan, and SKIP LOCKED would then pick more rows.
        `WITH picked AS MATERIALIZED (
           SELECT position FROM evaluation_examples
            WHERE evaluation_id = ? AND (status = 'pending' OR (status = 'running' AND lease_until <= clock_timestamp()))
            ORDER BY position LIMIT ? FOR UPDATE SKIP LOCKED)
         UPDATE evaluation_examples x
            SET status = 'running', lease_until = clock_timestamp() + make_interval(secs => ?::float8 / 1000),
                lease_token = ?::uuid, attempts = x.attempts + 1, request_id = coalesce(x.request_id, gen_random_uuid())
           FROM picked
          WHERE x.evaluation_id = ? AND x.position = picked.position
          RETURNING x.position, x.state, x.labels, x.request_id, x.attempts`,
        [id, free, input.leaseMs, input.token, id],
      );
      return rows.map(
        (r): ClaimedExample => ({
          evaluationId: id,
          accountId: e.account_id,
          position: r.position,
          state: r.state,
          labels: r.labels,
          questions: e.questions,
          requestId: r.request_id,
          attempts: r.attempts,
          leaseToken: input.token,
        }),
      );
    });
    claimed.push(...taken);
  }
  return claimed;
}

/**
 * Lengthens the lease of an example this attempt holds to `leaseMs` from now
 * (never shortens it), when its decision was given a longer deadline than the
 * claim planned for: no other replica takes it while it still runs. False when
 * the example is no longer this attempt's.
 */
export async function extendExampleLease(db: Knex, claimed: ClaimedExample, leaseMs: number): Promise<boolean> {
  const changed = await db("evaluation_examples")
    .where({ evaluation_id: claimed.evaluationId, position: claimed.position, lease_token: claimed.leaseToken, status: "running" })
    .update({ lease_until: db.raw("greatest(lease_until, clock_timestamp() + make_interval(secs => ?::float8 / 1000))", [leaseMs]) });
  return changed > 0;
}

/** What an attempt of an example ended with. */
export type ExampleOutcome =
  | { kind: "answered"; answers: Record<string, unknown>; chargeUnits: number; upstream: string; promptVersion: string }
  | { kind: "failed"; error: string }
  /** Put back to run later (shutdown, a retryable failure); the hold is released. */
  | { kind: "retry"; error: string }
  /** The hold was refused: the evaluation stops, the example waits for a resume. */
  | { kind: "stopped"; reason: StopReason };

/**
 * Records an example's outcome and finishes its hold in one transaction, only
 * while the example is still this attempt's (its lease token): an attempt that
 * lost its lease records and charges nothing, so each example is charged once.
 * Returns false when the example was no longer this attempt's. When this
 * finish stops or finishes the evaluation, its activity line is written too,
 * at `now` (else the database's clock).
 */
export async function finishExample(db: Knex, claimed: ClaimedExample, outcome: ExampleOutcome, now?: Date): Promise<boolean> {
  return db.transaction(async (tx) => {
    const mine = { evaluation_id: claimed.evaluationId, position: claimed.position, lease_token: claimed.leaseToken, status: "running" };
    const cleared = { lease_until: null, lease_token: null };
    let changed: number;
    if (outcome.kind === "answered" || outcome.kind === "failed") {
      changed = await tx("evaluation_examples")
        .where(mine)
        .update({
          ...cleared,
          status: outcome.kind === "answered" ? "done" : "failed",
          finished_at: tx.raw("clock_timestamp()"),
          ...(outcome.kind === "answered"
            ? { answers: JSON.stringify(outcome.answers), upstream: outcome.upstream, prompt_version: outcome.promptVersion, error: "" }
            : { error: outcome.error }),
        });
    } else {
      changed = await tx("evaluation_examples")
        .where(mine)
        .update({ ...cleared, status: "pending", request_id: null, error: outcome.kind === "retry" ? outcome.error : "" });
    }
    if (changed === 0) return false;
    const success = outcome.kind === "answered";
    const resolved = await finishExampleHold(tx, { requestId: claimed.requestId, success, chargeUnits: success ? outcome.chargeUnits : 0 });
    if (success) {
      await tx("evaluation_examples").where({ evaluation_id: claimed.evaluationId, position: claimed.position }).update({ charged_units: resolved.chargedUnits });
    }
    if (outcome.kind === "answered" || outcome.kind === "failed") {
      const { rows } = await tx.raw<{ rows: DbEvaluationRow[] }>(
        `UPDATE evaluations
            SET done = done + ?, failed = failed + ?,
                state = CASE WHEN done + failed + 1 >= total AND state IN ('running', 'stopped') THEN 'finished' ELSE state END,
                stop_reason = CASE WHEN done + failed + 1 >= total AND state IN ('running', 'stopped') THEN '' ELSE stop_reason END,
                finished_at = CASE WHEN done + failed + 1 >= total AND finished_at IS NULL THEN clock_timestamp() ELSE finished_at END
          WHERE id = ?
          RETURNING *`,
        [success ? 1 : 0, success ? 0 : 1, claimed.evaluationId],
      );
      // Each example counts once, under the row's lock: exactly one finish brings the count to the total.
      const row = rows[0];
      if (row && row.state === "finished" && row.done + row.failed === row.total) await recordRunnerActivity(tx, normalize(row), "evaluation_finished", now);
    } else if (outcome.kind === "stopped") {
      const [row] = await tx("evaluations").where({ id: claimed.evaluationId, state: "running" }).update({ state: "stopped", stop_reason: outcome.reason }).returning("*");
      if (row) await recordRunnerActivity(tx, normalize(row), "evaluation_stopped", now);
    }
    return true;
  });
}

/** What the runner tells of a stop or a finish it made, in text a member reads. */
const STOP_TEXT: Record<StopReason, string> = {
  CREDIT_CAP: "its credit cap was reached",
  INSUFFICIENT_BALANCE: "the account's balance ran out",
};

/**
 * The activity line of an evaluation that stopped or finished by itself,
 * written in the transaction of that change of state (so once, whoever
 * finishes the example and however often the finish is tried), by "system".
 * Its time is the account area's clock when given, as the members' lines are.
 */
async function recordRunnerActivity(tx: Knex.Transaction, row: DbEvaluationRow, kind: "evaluation_stopped" | "evaluation_finished", now: Date | undefined): Promise<void> {
  const spent = `charged ${unitsToCredits(row.charged_units)} credits, cap ${unitsToCredits(row.cap_units)} credits`;
  const what =
    kind === "evaluation_stopped"
      ? `stopped by the evaluation runner: ${STOP_TEXT[row.stop_reason as StopReason] ?? row.stop_reason} (${row.stop_reason}); ${row.done + row.failed} of ${row.total} examples run`
      : `finished by the evaluation runner: ${row.done} answered, ${row.failed} failed, of ${row.total}`;
  await recordActivity(tx, { accountId: row.account_id, kind, actor: SYSTEM, detail: `${row.id}: ${what}; ${spent}`, at: now ?? tx.raw("clock_timestamp()") });
}

/**
 * Gives back the holds of examples whose replica died while their evaluation
 * no longer runs (cancelled or stopped meanwhile): nobody would take them
 * again. Returns how many.
 */
export async function releaseOrphanedExamples(db: Knex): Promise<number> {
  const orphans = await db("evaluation_examples as x")
    .join("evaluations as e", "e.id", "x.evaluation_id")
    .where("x.status", "running")
    .whereNot("e.state", "running")
    .where("x.lease_until", "<=", db.raw("clock_timestamp()"))
    .limit(100)
    .select("x.evaluation_id", "x.position", "x.request_id", "x.lease_token");
  let released = 0;
  for (const o of orphans as Array<{ evaluation_id: string; position: number; request_id: string; lease_token: string }>) {
    const ok = await db.transaction(async (tx) => {
      const n = await tx("evaluation_examples")
        .where({ evaluation_id: o.evaluation_id, position: o.position, lease_token: o.lease_token, status: "running" })
        .where("lease_until", "<=", tx.raw("clock_timestamp()"))
        .update({ status: "pending", request_id: null, lease_until: null, lease_token: null });
      if (n === 0) return false;
      await finishExampleHold(tx, { requestId: o.request_id, success: false, chargeUnits: 0 });
      return true;
    });
    if (ok) released++;
  }
  return released;
}

/** The finished examples of an evaluation, in order, for its results. */
export async function answeredExamples(
  db: Knex | Knex.Transaction,
  evaluationId: string,
): Promise<Array<{ position: number; labels: Record<string, boolean | string>; answers: Record<string, Record<string, unknown>>; upstream: string; prompt_version: string }>> {
  return db("evaluation_examples")
    .where({ evaluation_id: evaluationId, status: "done" })
    .orderBy("position")
    .select("position", "labels", "answers", "upstream", "prompt_version");
}

function viewOf(row: DbEvaluationRow & { examples_per_second: number }): EvaluationView {
  return { ...normalize(row), examplesPerSecond: Number(row.examples_per_second) };
}

/** bigint columns arrive as strings from pg. */
function normalize(row: DbEvaluationRow): DbEvaluationRow {
  return { ...row, cap_units: Number(row.cap_units), charged_units: Number(row.charged_units), held_units: Number(row.held_units) };
}
