import { create, fromJson, type JsonObject, type JsonValue } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { Knex } from "knex";
import { recordActivity } from "../team/activity.js";
import { questionSpecs } from "../decision/service.js";
import { apiError } from "../errors.js";
import { CalibrationSchema, type Calibration } from "../gen/typesafe/account/v1/account_service_pb.js";
import { DecideRequestSchema, QuestionSchema } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { SUPPORTED_MODEL } from "../decision/validate.js";
import { throwIfInvalid } from "../validation.js";
import { fitCalibration, type FitRequest, type HeldOutMetrics } from "./calibration-fit.js";
import { insertCalibration, signatureColumns, type DbCalibrationRow } from "./calibration-store.js";
import { signatureDigest, signatureOf } from "./calibration-signature.js";
import { questionPoints } from "./results.js";
import { answeredExamples, type DbEvaluationRow } from "./store.js";

/** The methods a fit from labelled answers takes, by question type. */
const METHODS_OF = { noul: ["platt", "isotonic"], choice: ["temperature", "vector"], score: ["temperature", "vector"] } as const;

export interface FitFromEvaluationInput {
  evaluation: DbEvaluationRow;
  questionKey: string;
  method: string;
  /** A member's email. */
  createdBy: string;
  at: Date;
}

/**
 * Fits one question's calibration from a finished evaluation's stored
 * answers and labels, and stores it with its held-out metrics under the
 * signature the answers were read with (one upstream and one prompt version:
 * a run that changed either mid-way gives no signature and is refused).
 */
export async function fitFromEvaluation(db: Knex, input: FitFromEvaluationInput): Promise<DbCalibrationRow> {
  const { evaluation } = input;
  throwIfInvalid(input.questionKey === "" ? [{ field: "question_key", rule: "required" }] : []);
  throwIfInvalid(!evaluation.question_keys.includes(input.questionKey) ? [{ field: "question_key", rule: "a question key of the evaluation" }] : []);
  const question = fromJson(QuestionSchema, evaluation.questions[input.questionKey] as JsonValue);
  const [spec] = questionSpecs(create(DecideRequestSchema, { questions: { [input.questionKey]: question } }));
  const methods: readonly string[] = METHODS_OF[spec!.type];
  throwIfInvalid(!methods.includes(input.method) ? [{ field: "method", rule: `for a ${spec!.type} question, one of ${methods.join(", ")}` }] : []);
  if (evaluation.state !== "finished") {
    const rule = "only a finished evaluation can be fitted";
    throw apiError("EVALUATION_STATE", `${rule} (this one is ${evaluation.state})`, { rule, metadata: { state: evaluation.state, action: "fit" } });
  }
  const rows = (await answeredExamples(db, evaluation.id)).filter((row) => (row.answers[spec!.key] as { type?: string } | undefined)?.type === spec!.type);
  const upstreams = [...new Set(rows.map((r) => r.upstream))];
  const promptVersions = [...new Set(rows.map((r) => r.prompt_version))];
  throwIfInvalid(
    upstreams.length > 1 || promptVersions.length > 1
      ? [{ field: "evaluation_id", rule: "answered by one upstream model and one prompt version (this run changed mid-way)" }]
      : [],
  );
  const { noul, distribution, names } = questionPoints(spec!, rows);
  const request: FitRequest =
    spec!.type === "noul"
      ? { type: "noul", method: input.method as "platt" | "isotonic", points: noul }
      : { type: spec!.type, method: input.method as "temperature" | "vector", points: distribution, labelCount: names.length };
  let fit;
  try {
    fit = fitCalibration(request);
  } catch (error) {
    if (!(error instanceof RangeError)) throw error;
    throw apiError("INVALID_ARGUMENT", `question_key: ${error.message}`, { field: "question_key", rule: error.message });
  }
  const signature = signatureOf(spec!, { promptVersion: promptVersions[0] ?? "", model: SUPPORTED_MODEL, upstream: upstreams[0] ?? "" });
  const row = await insertCalibration(db, {
    account_id: evaluation.account_id,
    evaluation_id: evaluation.id,
    question_key: spec!.key,
    method: fit.params.method,
    ...signatureColumns(signature, signatureDigest(signature)),
    parameters: fit.params,
    held_out: fit.heldOut,
    created_by: input.createdBy,
  });
  await recordActivity(db, {
    accountId: evaluation.account_id,
    kind: "calibration_fitted",
    actor: input.createdBy,
    detail: `${row.id}: ${row.method} v${row.version} of ${evaluation.id} ${spec!.key}`,
    at: input.at,
  });
  return row;
}

/** The calibration as the API shows it. */
export function calibrationMessage(row: DbCalibrationRow): Calibration {
  const metrics = (m: HeldOutMetrics) => ({
    count: m.count,
    ece: m.ece ?? undefined,
    brier: m.brier ?? undefined,
    logLoss: m.logLoss ?? undefined,
    accuracy: m.accuracy ?? undefined,
  });
  return create(CalibrationSchema, {
    id: row.id,
    evaluationId: row.evaluation_id,
    questionKey: row.question_key,
    method: row.method,
    version: row.version,
    signature: {
      type: row.question_type,
      instructions: row.instructions,
      labels: row.labels,
      promptVersion: row.prompt_version,
      model: row.model,
      upstream: row.upstream,
    },
    parameters: row.parameters as unknown as JsonObject,
    heldOut: { folds: row.held_out.folds, seed: row.held_out.seed, before: metrics(row.held_out.before), after: metrics(row.held_out.after) },
    createdBy: row.created_by,
    createdAt: timestampFromDate(row.created_at),
  });
}
