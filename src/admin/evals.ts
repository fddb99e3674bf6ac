import { createReadStream } from "node:fs";
import fs from "node:fs/promises";
import { fromJson, toJson, type JsonValue } from "@bufbuild/protobuf";
import type { Knex } from "knex";
import { OPERATOR } from "../team/activity.js";
import { findAccount } from "./account-funding.js";
import { isUuid } from "../validation.js";
import { describeError } from "../errors.js";
import { changeEvaluation, createEvaluationFromFile, deleteEvaluationRecorded, evaluationMessage } from "../evaluation/evaluations.js";
import { MAX_EXAMPLES, MAX_EXAMPLES_FILE_BYTES, MAX_LINE_BYTES } from "../evaluation/examples.js";
import { evaluationResults } from "../evaluation/results.js";
import { evaluationResultsCsv } from "../evaluation/results-csv.js";
import { findEvaluation, listEvaluations } from "../evaluation/store.js";
import { EvaluationSchema, QuestionResultsSchema as QuestionResultsJson } from "../gen/typesafe/account/v1/account_service_pb.js";
import { QuestionSchema, type Question } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { parseCredits } from "../units.js";
import { UsageError } from "./usage-error.js";

type Options = Record<string, string | boolean | undefined>;

/**
 * The operator's evaluation commands: the same validation, storage and
 * results as the account area's RPCs (the actor is "operator"). A running
 * service's runner picks a new evaluation up within its poll interval.
 */
export async function runEvals(db: Knex, command: string, options: Options, now: Date): Promise<unknown> {
  switch (command) {
    case "evals create": {
      const accountId = required(options, "account");
      if (!isUuid(accountId) || !(await findAccount(db, accountId))) throw new UsageError(`no account with id ${accountId}`);
      const questions = await readQuestions(required(options, "questions"));
      const path = required(options, "file");
      const format = path.toLowerCase().endsWith(".csv") ? "csv" : "jsonl";
      const stat = await fs.stat(path).catch(() => undefined);
      if (!stat?.isFile()) throw new UsageError(`--file: no file ${path}`);
      if (stat.size > MAX_EXAMPLES_FILE_BYTES) throw new UsageError(`--file: at most ${MAX_EXAMPLES_FILE_BYTES} bytes (${MAX_EXAMPLES} examples of up to ${MAX_LINE_BYTES} bytes a line)`);
      const inFlight = options["in-flight"] === undefined ? 0 : Number(options["in-flight"]);
      try {
        const row = await createEvaluationFromFile(db, {
          accountId,
          createdBy: OPERATOR,
          name: typeof options["name"] === "string" ? options["name"] : "",
          questions,
          file: createReadStream(path),
          format,
          capUnits: capOption(required(options, "cap")),
          examplesInFlight: inFlight,
          at: now,
        });
        return evaluationJson(row);
      } catch (err) {
        const { detail, message } = describeError(err);
        if (detail.reason !== "INVALID_ARGUMENT") throw err;
        throw new UsageError(violationLines((detail.metadata["violations"] ?? message).split("\n"), Number(detail.metadata["more_violations"] ?? 0) + 1));
      }
    }
    case "evals show": {
      if (options["evaluation"] === undefined) {
        const accountId = required(options, "account");
        if (!isUuid(accountId) || !(await findAccount(db, accountId))) throw new UsageError(`no account with id ${accountId}`);
        return { account_id: accountId, evaluations: (await listEvaluations(db, accountId, 100)).map(evaluationJson) };
      }
      const { accountId, id } = await evaluationOption(db, options);
      return evaluationJson((await findEvaluation(db, accountId, id))!);
    }
    case "evals results": {
      const { accountId, id } = await evaluationOption(db, options);
      const evaluation = (await findEvaluation(db, accountId, id))!;
      const results = await evaluationResults(db, evaluation);
      if (options["csv"] === true) return evaluationResultsCsv(results);
      return {
        evaluation: evaluationJson(evaluation),
        model: results.model,
        upstream: results.upstream,
        prompt_version: results.promptVersion,
        questions: Object.fromEntries(Object.entries(results.questions).map(([key, q]) => [key, toJson(QuestionResultsJson, q, { useProtoFieldName: true })])),
      };
    }
    case "evals cancel":
    case "evals resume": {
      const { accountId, id } = await evaluationOption(db, options);
      const by = { accountId, actor: OPERATOR, at: now };
      const change = await changeEvaluation(db, by, id, command === "evals cancel" ? { action: "cancel" } : { action: "resume", capUnits: undefined });
      if (!change.changed) throw new UsageError(`the evaluation is ${change.row!.state}: ${command === "evals cancel" ? "only a running or stopped one can be cancelled" : "only a stopped one can be resumed"}`);
      return evaluationJson((await findEvaluation(db, accountId, id))!);
    }
    case "evals delete": {
      const { accountId, id } = await evaluationOption(db, options);
      const before = await findEvaluation(db, accountId, id);
      const outcome = before ? await deleteEvaluationRecorded(db, { accountId, actor: OPERATOR, at: now }, before) : "not_found";
      if (outcome === "busy") throw new UsageError("the evaluation is running or has examples in flight: cancel it first");
      return { deleted: true, evaluation_id: id };
    }
    default:
      throw new UsageError(`unknown command "${command}": see --help`);
  }
}

function required(options: Options, name: string): string {
  const value = options[name];
  if (typeof value !== "string" || value === "") throw new UsageError(`--${name} is required`);
  return value;
}

function capOption(text: string): number {
  try {
    return parseCredits(text);
  } catch (err) {
    throw new UsageError(`--cap: ${err instanceof Error ? err.message : String(err)}`);
  }
}

async function evaluationOption(db: Knex, options: Options): Promise<{ accountId: string; id: string }> {
  const id = required(options, "evaluation");
  const row = isUuid(id) ? await db("evaluations").where({ id }).first("account_id") : undefined;
  if (!row) throw new UsageError(`no evaluation with id ${id}`);
  return { accountId: row.account_id, id };
}

/** The questions file: a JSON object of question key to question, exactly a decision's `questions`. */
async function readQuestions(path: string): Promise<Record<string, Question>> {
  let json: unknown;
  try {
    json = JSON.parse(await fs.readFile(path, "utf8"));
  } catch {
    throw new UsageError(`--questions: ${path} must be a JSON object of question key to question`);
  }
  if (typeof json !== "object" || json === null || Array.isArray(json)) throw new UsageError(`--questions: ${path} must be a JSON object of question key to question`);
  const questions: Record<string, Question> = {};
  for (const [key, question] of Object.entries(json)) {
    try {
      questions[key] = fromJson(QuestionSchema, question as JsonValue);
    } catch (err) {
      throw new UsageError(`--questions: ${key}: ${err instanceof Error ? err.message : String(err)}`);
    }
  }
  return questions;
}

/** Every violation on its own line, the first ones only when there are many. */
function violationLines(lines: string[], total = lines.length): string {
  const shown = lines.slice(0, 50);
  return `the examples were not stored (${total} problem${total === 1 ? "" : "s"}):\n  ${shown.join("\n  ")}${total > shown.length ? `\n  … and ${total - shown.length} more` : ""}`;
}

function evaluationJson(row: Parameters<typeof evaluationMessage>[0]) {
  return toJson(EvaluationSchema, evaluationMessage(row), { useProtoFieldName: true });
}
