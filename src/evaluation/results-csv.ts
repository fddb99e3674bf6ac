import { csvField } from "../csv-field.js";
import type { EvaluationResults } from "./results.js";

/** The metrics columns of the results CSV, in order; a metric a question type has not is an empty cell. */
export const RESULTS_CSV_METRICS = ["accuracy", "brier", "log_loss", "ece", "auroc", "macro_f1", "mae_steps"] as const;

/** The results CSV's header line, as its columns are named. */
export const RESULTS_CSV_COLUMNS = ["question", "type", "labelled", "answered", ...RESULTS_CSV_METRICS, "model", "upstream", "prompt_version"] as const;

/**
 * An evaluation's results as one CSV file (RFC 4180, CRLF lines): a line per
 * question with its counts, metrics and what answered. The operator's
 * `evals results --csv` and the account area's download both print this, so
 * the two files are the same bytes; every field passes the formula guard
 * usage.csv uses, since question keys are the member's own text.
 */
export function evaluationResultsCsv(results: EvaluationResults): string {
  const rows = Object.entries(results.questions).map(([key, q]) => [
    key,
    q.type,
    String(q.labelled),
    String(q.answered),
    ...RESULTS_CSV_METRICS.map((m) => (q.metrics[m] === undefined ? "" : String(q.metrics[m]))),
    results.model,
    results.upstream,
    results.promptVersion,
  ]);
  return [[...RESULTS_CSV_COLUMNS], ...rows].map((fields) => fields.map(csvField).join(",") + "\r\n").join("");
}
