import { create, type JsonValue, fromJson } from "@bufbuild/protobuf";
import type { Knex } from "knex";
import { questionSpecs } from "../decision/service.js";
import type { QuestionSpec } from "../decision/engine.js";
import { QuestionResultsSchema, type QuestionResults } from "../gen/typesafe/account/v1/account_service_pb.js";
import { DecideRequestSchema, QuestionSchema, type Question } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { SUPPORTED_MODEL } from "../decision/validate.js";
import { choiceMetrics, noulMetrics, scoreMetrics, type DistributionPoint, type LabelMassSummary, type LargestError, type NoulPoint, type ReliabilityBin } from "./metrics.js";
import { answeredExamples, type DbEvaluationRow } from "./store.js";

/** An answer as the runner stored it (the decision's Answer, in its JSON form). */
interface StoredAnswer {
  type?: string;
  noul?: number;
  probabilities?: Record<string, number>;
  xLabelMass?: number;
}

export interface EvaluationResults {
  questions: Record<string, QuestionResults>;
  model: string;
  upstream: string;
  promptVersion: string;
}

/**
 * Each question's metrics over the examples that label it and got an answer
 * to it (an answer of type "error" counts as labelled, not answered). The
 * math is the metrics module's; this only turns stored answers into its
 * points, in the options' canonical order.
 */
export async function evaluationResults(db: Knex | Knex.Transaction, evaluation: DbEvaluationRow): Promise<EvaluationResults> {
  const rows = await answeredExamples(db, evaluation.id);
  const questions = Object.fromEntries(evaluation.question_keys.map((key) => [key, fromJson(QuestionSchema, evaluation.questions[key] as JsonValue)])) as Record<string, Question>;
  const specs = questionSpecs(create(DecideRequestSchema, { questions }));
  const results: Record<string, QuestionResults> = {};
  for (const spec of specs) {
    const { labelled, noul, distribution, names } = questionPoints(spec, rows);
    results[spec.key] = questionResults(spec, labelled, noul, distribution, names);
  }
  const distinct = (values: Array<string | null>) => [...new Set(values.filter((v): v is string => !!v))].join(", ");
  return {
    questions: results,
    model: SUPPORTED_MODEL,
    upstream: distinct(rows.map((r) => r.upstream)),
    promptVersion: distinct(rows.map((r) => r.prompt_version)),
  };
}

/** The labelled points of one question: noul's P(true) or the distribution in the options' canonical order, with the example's label. */
export function questionPoints(
  spec: QuestionSpec,
  rows: ReadonlyArray<{ position: number; labels: Record<string, boolean | string>; answers: Record<string, Record<string, unknown>> }>,
): { labelled: number; noul: NoulPoint[]; distribution: DistributionPoint[]; names: readonly string[] } {
  let labelled = 0;
  const noul: NoulPoint[] = [];
  const distribution: DistributionPoint[] = [];
  const names = spec.type === "choice" ? spec.options : spec.type === "score" ? spec.labels : [];
  for (const row of rows) {
    const label = row.labels[spec.key];
    if (label === undefined) continue;
    labelled++;
    const answer = (row.answers[spec.key] ?? {}) as StoredAnswer;
    if (answer.type !== spec.type) continue;
    const exampleId = String(row.position);
    if (spec.type === "noul") {
      noul.push({ probabilityTrue: clamp(answer.noul ?? 0), label: label === true, labelMass: answer.xLabelMass, exampleId });
    } else {
      const probabilities = names.map((name, i) => clamp(answer.probabilities?.[spec.type === "choice" ? name : String(i)] ?? 0));
      distribution.push({ probabilities, label: names.indexOf(String(label)), labelMass: answer.xLabelMass, exampleId });
    }
  }
  return { labelled, noul, distribution, names };
}

function questionResults(spec: QuestionSpec, labelled: number, noul: NoulPoint[], distribution: DistributionPoint[], names: readonly string[]): QuestionResults {
  const metrics: Record<string, number> = {};
  const put = (name: string, value: number | null) => {
    if (value !== null && Number.isFinite(value)) metrics[name] = value;
  };
  let reliability: ReliabilityBin[];
  let labelMass: LabelMassSummary | null;
  let largest: LargestError[];
  let confusion: number[][] = [];
  let answered: number;
  const expectedOf = (index: number): [string, string] => {
    if (spec.type === "noul") {
      const point = noul[index]!;
      return [String(point.label), String(point.probabilityTrue >= 0.5)];
    }
    const point = distribution[index]!;
    const top = point.probabilities.indexOf(Math.max(...point.probabilities));
    return [names[point.label] ?? "", names[top] ?? ""];
  };
  if (spec.type === "noul") {
    const m = noulMetrics(noul);
    answered = m.count;
    put("accuracy", m.accuracy);
    put("brier", m.brier);
    put("log_loss", m.logLoss);
    put("ece", m.ece);
    put("auroc", m.auroc);
    ({ reliability, labelMass, largestErrors: largest } = m);
  } else if (spec.type === "choice") {
    const m = choiceMetrics(distribution, names);
    answered = m.count;
    put("accuracy", m.accuracy);
    put("macro_f1", m.macroF1);
    put("ece", m.topLabelEce);
    put("brier", m.brier);
    put("log_loss", m.logLoss);
    ({ reliability, labelMass, largestErrors: largest, confusion } = m);
  } else {
    const m = scoreMetrics(distribution, names);
    answered = m.count;
    put("accuracy", m.exactAccuracy);
    put("mae_steps", m.meanAbsoluteError);
    put("ece", m.topLabelEce);
    put("brier", m.brier);
    put("log_loss", m.logLoss);
    ({ reliability, labelMass, largestErrors: largest } = m);
    confusion = names.map(() => names.map(() => 0));
    for (const point of distribution) confusion[point.label]![point.probabilities.indexOf(Math.max(...point.probabilities))]!++;
  }
  return create(QuestionResultsSchema, {
    type: spec.type,
    labelled,
    answered,
    metrics,
    reliability: reliability.map((bin) => ({
      lower: bin.binLower,
      upper: bin.binUpper,
      count: bin.count,
      meanPredicted: bin.meanPredicted ?? undefined,
      observed: bin.observedFrequency ?? undefined,
    })),
    labels: [...names],
    confusion: confusion.map((counts, i) => ({ label: names[i]!, counts })),
    labelMass: labelMass ?? undefined,
    largestErrors: largest.map((e) => {
      const [expected, predicted] = expectedOf(e.index);
      return { line: Number(e.exampleId ?? e.index + 1), expected, predicted, error: e.error };
    }),
  });
}

/** Stored answers are rounded to 6 digits; a probability can come back a hair outside [0, 1]. */
function clamp(p: number): number {
  return Math.min(1, Math.max(0, p));
}
