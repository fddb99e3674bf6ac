import { create, toJson, type JsonValue } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { Knex } from "knex";
import { recordActivity } from "../team/activity.js";
import { apiError } from "../errors.js";
import { EvaluationSchema, type Evaluation } from "../gen/typesafe/account/v1/account_service_pb.js";
import { QuestionSchema, type Question } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { unitsToCredits } from "../units.js";
import { fileLineField, parseExamples, validateEvaluation, type ExampleInput, type ExampleViolation } from "./examples.js";
import { cancelEvaluation, deleteEvaluation, insertEvaluation, resumeEvaluation, type DbEvaluationRow, type EvaluationView } from "./store.js";

/** Examples in flight when the caller does not say. */
export const DEFAULT_EXAMPLES_IN_FLIGHT = 2;
export const MAX_EXAMPLES_IN_FLIGHT = 8;
export const MAX_EVALUATION_NAME_CHARS = 100;
/** Violations an error's metadata lists; the count of the rest follows. */
const LISTED_VIOLATIONS = 50;

export interface CreateEvaluationInput {
  accountId: string;
  /** A member's email, or "operator". */
  createdBy: string;
  name: string;
  questions: Record<string, Question>;
  examples: readonly ExampleInput[];
  capUnits: number;
  /** 0 means DEFAULT_EXAMPLES_IN_FLIGHT. */
  examplesInFlight: number;
  /** How a violation's field is named on this surface: `examples[3].labels.q` for the API, `line 4: labels.q` for a file. */
  fieldOf: (violation: ExampleViolation) => string;
  at: Date;
}

/**
 * Validates and stores an evaluation, the same for the account area and the
 * operator CLI: every violation is collected first (the error names the
 * first, its metadata lists them), and nothing is stored unless all pass.
 */
export async function createEvaluation(db: Knex, input: CreateEvaluationInput): Promise<DbEvaluationRow> {
  const name = input.name.trim();
  const violations: Array<{ field: string; rule: string }> = [];
  if ([...name].length > MAX_EVALUATION_NAME_CHARS || /[\p{Cc}\p{Cf}]/u.test(name)) {
    violations.push({ field: "name", rule: `at most ${MAX_EVALUATION_NAME_CHARS} characters, no control characters` });
  }
  if (!Number.isSafeInteger(input.capUnits) || input.capUnits <= 0) {
    violations.push({ field: "credit_cap_credits", rule: "must be above 0, with at most 6 decimals" });
  }
  const inFlight = input.examplesInFlight === 0 ? DEFAULT_EXAMPLES_IN_FLIGHT : input.examplesInFlight;
  if (!Number.isInteger(inFlight) || inFlight < 1 || inFlight > MAX_EXAMPLES_IN_FLIGHT) {
    violations.push({ field: "examples_in_flight", rule: `must be 1 to ${MAX_EXAMPLES_IN_FLIGHT} (0 means ${DEFAULT_EXAMPLES_IN_FLIGHT})` });
  }
  const checked = validateEvaluation(input.questions, input.examples);
  for (const v of checked.violations) violations.push({ field: v.line === 0 ? v.field : input.fieldOf(v), rule: v.rule });
  throwIfAnyInvalid(violations);
  const questionKeys = Object.keys(input.questions);
  const questions = Object.fromEntries(questionKeys.map((key) => [key, toJson(QuestionSchema, input.questions[key]!) as JsonValue]));
  const row = await insertEvaluation(db, {
    accountId: input.accountId,
    name,
    questions,
    questionKeys,
    capUnits: input.capUnits,
    examplesInFlight: inFlight,
    createdBy: input.createdBy,
    examples: checked.examples,
  });
  await recordActivity(db, {
    accountId: input.accountId,
    kind: "evaluation_created",
    actor: input.createdBy,
    detail: `${row.id}: ${row.total} examples, cap ${unitsToCredits(row.cap_units)} credits`,
    at: input.at,
  });
  return row;
}

/** What the activity log says of a cancelled, resumed or deleted evaluation: which one, and what it has spent against its cap. */
export function evaluationActivityDetail(row: Pick<DbEvaluationRow, "id" | "charged_units" | "cap_units">): string {
  return `${row.id}: charged ${unitsToCredits(row.charged_units)} credits, cap ${unitsToCredits(row.cap_units)} credits`;
}

/** Who changes an evaluation, and when: a member's email or "operator", at the account area's clock. */
export interface EvaluationActor {
  accountId: string;
  actor: string;
  at: Date;
}

/**
 * Cancels (or resumes, with a new cap when given) an evaluation and, when it
 * changed, writes its activity line in the same transaction, so a crash
 * between the two cannot lose the line.
 */
export async function changeEvaluation(
  db: Knex,
  by: EvaluationActor,
  id: string,
  change: { action: "cancel" } | { action: "resume"; capUnits: number | undefined },
): Promise<{ row?: DbEvaluationRow; changed: boolean }> {
  return db.transaction(async (tx) => {
    const made = change.action === "cancel" ? await cancelEvaluation(tx, by.accountId, id) : await resumeEvaluation(tx, by.accountId, id, change.capUnits);
    if (made.changed) {
      const kind = change.action === "cancel" ? "evaluation_cancelled" : "evaluation_resumed";
      await recordActivity(tx, { accountId: by.accountId, kind, actor: by.actor, detail: evaluationActivityDetail(made.row!), at: by.at });
    }
    return made;
  });
}

/** Deletes an evaluation (`before` is its row as last read) and, when it went, writes its activity line in the same transaction. */
export async function deleteEvaluationRecorded(db: Knex, by: EvaluationActor, before: DbEvaluationRow): Promise<"deleted" | "not_found" | "busy"> {
  return db.transaction(async (tx) => {
    const outcome = await deleteEvaluation(tx, by.accountId, before.id);
    if (outcome === "deleted") await recordActivity(tx, { accountId: by.accountId, kind: "evaluation_deleted", actor: by.actor, detail: evaluationActivityDetail(before), at: by.at });
    return outcome;
  });
}

/** An evaluation whose examples come as a file (JSON Lines or CSV), read as it arrives. */
export interface CreateFromFileInput extends Omit<CreateEvaluationInput, "examples" | "fieldOf"> {
  file: AsyncIterable<Uint8Array | string>;
  format: "jsonl" | "csv";
}

/**
 * The file doors' create (the operator CLI, the account area's upload): the
 * file is parsed line by line, every bad line reported with its number and
 * field (`line 4: labels.urgent`), and nothing stored unless every line and
 * every example passes.
 */
export async function createEvaluationFromFile(db: Knex, input: CreateFromFileInput): Promise<DbEvaluationRow> {
  const { file, format, ...rest } = input;
  const parsed = await parseExamples(file, format, input.questions);
  throwIfAnyInvalid(parsed.violations.map((v) => ({ field: fileLineField(v), rule: v.rule })));
  return createEvaluation(db, { ...rest, examples: parsed.examples, fieldOf: fileLineField });
}

/** A 400 naming the first violation, with every violation (up to a bound) in its metadata. */
export function throwIfAnyInvalid(violations: ReadonlyArray<{ field: string; rule: string }>): void {
  const first = violations[0];
  if (!first) return;
  const listed = violations.slice(0, LISTED_VIOLATIONS).map((v) => `${v.field}: ${v.rule}`);
  throw apiError("INVALID_ARGUMENT", `${first.field}: ${first.rule}`, {
    field: first.field,
    rule: first.rule,
    metadata: {
      violations: listed.join("\n"),
      ...(violations.length > 1 ? { more_violations: String(violations.length - 1) } : {}),
    },
  });
}

/** The evaluation as the API shows it: credits, progress, and the time left at the current rate. */
export function evaluationMessage(row: DbEvaluationRow | EvaluationView): Evaluation {
  const rate = "examplesPerSecond" in row ? row.examplesPerSecond : 0;
  const left = row.total - row.done - row.failed;
  return create(EvaluationSchema, {
    id: row.id,
    name: row.name,
    state: row.state,
    stopReason: row.stop_reason,
    progress: {
      total: row.total,
      done: row.done,
      failed: row.failed,
      examplesPerSecond: rate,
      secondsLeft: row.state === "running" && rate > 0 ? left / rate : undefined,
    },
    creditCapCredits: unitsToCredits(row.cap_units),
    chargedCredits: unitsToCredits(row.charged_units),
    examplesInFlight: row.examples_in_flight,
    questionKeys: row.question_keys,
    createdBy: row.created_by,
    createdAt: timestampFromDate(row.created_at),
    finishedAt: row.finished_at ? timestampFromDate(row.finished_at) : undefined,
  });
}
