import { fromJson, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema, type Value } from "@bufbuild/protobuf/wkt";
import { Chart, LinearScale, LineController, LineElement, PointElement, ScatterController, Tooltip, Legend } from "chart.js";
import type { Evaluation, GetEvaluationResultsResponse } from "../../gen/typesafe/account/v1/account_service_pb.js";
import { QuestionSchema, type Question } from "../../gen/typesafe/decision/v1/decision_service_pb.js";
import type { AccountClient } from "./client.js";
import { byId, emptyRow, formatCredits, numberCell, row } from "./dom.js";

Chart.register(ScatterController, LineController, LineElement, PointElement, LinearScale, Tooltip, Legend);

/** How often the list is read again while an evaluation runs. */
const REFRESH_MS = 1_000;
const METRIC_NAMES = ["accuracy", "brier", "log_loss", "ece", "auroc", "macro_f1", "mae_steps"];

export interface EvaluationsViewOptions {
  client: AccountClient;
  fail(err: unknown, where: HTMLElement): void;
}

/**
 * The evaluations view: start one from a questions object and a JSON Lines
 * file of labelled examples, follow its progress, and read its results: a
 * metrics table per question and the reliability diagram with its table.
 */
export function createEvaluationsView(options: EvaluationsViewOptions): { load(): Promise<void>; clear(): void } {
  const { client } = options;
  const form = byId("evaluation-form", HTMLFormElement);
  const questionsInput = byId("evaluation-questions", HTMLTextAreaElement);
  const fileInput = byId("evaluation-file", HTMLInputElement);
  const capInput = byId("evaluation-cap", HTMLInputElement);
  const error = byId("evaluations-error", HTMLElement);
  const table = byId("evaluations-table", HTMLTableElement);
  const results = byId("evaluation-results", HTMLElement);
  const metricsTable = byId("evaluation-metrics-table", HTMLTableElement);
  const reliabilityTable = byId("reliability-table", HTMLTableElement);
  const canvas = byId("reliability-chart", HTMLCanvasElement);
  let timer: ReturnType<typeof setTimeout> | undefined;
  let chart: Chart | undefined;

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    error.textContent = "";
    void start().catch((err: unknown) => options.fail(err, error));
  });

  async function start(): Promise<void> {
    let questions: Record<string, Question>;
    try {
      const parsed = JSON.parse(questionsInput.value) as Record<string, JsonValue>;
      questions = Object.fromEntries(Object.entries(parsed).map(([key, q]) => [key, fromJson(QuestionSchema, q)]));
    } catch {
      error.textContent = "Write the questions as a JSON object of question key to question, as a decision takes them.";
      return;
    }
    const file = fileInput.files?.[0];
    if (!file) {
      error.textContent = "Choose a JSON Lines file of examples.";
      return;
    }
    const examples: Array<{ state: Value; labels: Record<string, Value> }> = [];
    for (const [index, line] of (await file.text()).split("\n").entries()) {
      if (line.trim() === "") continue;
      try {
        const { state, labels } = JSON.parse(line) as { state: JsonValue; labels: Record<string, JsonValue> };
        examples.push({ state: fromJson(ValueSchema, state), labels: Object.fromEntries(Object.entries(labels).map(([k, v]) => [k, fromJson(ValueSchema, v)])) });
      } catch {
        error.textContent = `Line ${index + 1} is not a JSON object with state and labels.`;
        return;
      }
    }
    await client.createEvaluation({ name: file.name, questions, examples, creditCapCredits: Number(capInput.value) });
    form.reset();
    await load();
  }

  function evaluationRow(evaluation: Evaluation): HTMLTableRowElement {
    const progress = evaluation.progress!;
    const show = document.createElement("button");
    show.type = "button";
    show.textContent = "Results";
    show.addEventListener("click", () => void showResults(evaluation.id).catch((err: unknown) => options.fail(err, error)));
    const tr = row([
      evaluation.name,
      evaluation.state + (evaluation.stopReason ? ` (${evaluation.stopReason})` : ""),
      numberCell(`${progress.done + progress.failed} / ${progress.total}`),
      numberCell(progress.examplesPerSecond.toFixed(1)),
      numberCell(formatCredits(evaluation.chargedCredits)),
      show,
    ]);
    tr.dataset["id"] = evaluation.id;
    tr.dataset["state"] = evaluation.state;
    return tr;
  }

  async function load(): Promise<void> {
    if (timer) clearTimeout(timer);
    const { evaluations } = await client.listEvaluations({});
    const body = table.tBodies[0]!;
    body.replaceChildren(...(evaluations.length > 0 ? evaluations.map(evaluationRow) : [emptyRow(table, "No evaluation yet.")]));
    if (evaluations.some((e) => e.state === "running") && !byId("view-evaluations", HTMLElement).hidden) {
      timer = setTimeout(() => void load().catch((err: unknown) => options.fail(err, error)), REFRESH_MS);
    }
  }

  async function showResults(evaluationId: string): Promise<void> {
    const answer = await client.getEvaluationResults({ evaluationId });
    writeMetrics(answer);
    const [key, first] = Object.entries(answer.questions)[0] ?? [];
    const bins = first?.reliability ?? [];
    reliabilityTable.caption!.textContent = `Reliability of ${key ?? ""}: mean predicted probability against observed frequency, per bin`;
    reliabilityTable.tBodies[0]!.replaceChildren(
      ...bins.map((bin) =>
        row([`${bin.lower.toFixed(1)}–${bin.upper.toFixed(1)}`, numberCell(String(bin.count)), numberCell(bin.meanPredicted?.toFixed(3) ?? "–"), numberCell(bin.observed?.toFixed(3) ?? "–")]),
      ),
    );
    chart?.destroy();
    chart = new Chart(canvas, {
      type: "scatter",
      data: {
        datasets: [
          { label: "answers", data: bins.filter((b) => b.count > 0).map((b) => ({ x: b.meanPredicted ?? 0, y: b.observed ?? 0 })), backgroundColor: "#0b5cad", pointRadius: 4 },
          { type: "line", label: "perfect calibration", data: [{ x: 0, y: 0 }, { x: 1, y: 1 }], borderColor: "#6e7781", borderDash: [6, 4], pointRadius: 0 },
        ],
      },
      options: {
        animation: false,
        maintainAspectRatio: false,
        scales: {
          x: { type: "linear", min: 0, max: 1, title: { display: true, text: "mean predicted probability" } },
          y: { type: "linear", min: 0, max: 1, title: { display: true, text: "observed frequency" } },
        },
      },
    });
    results.hidden = false;
  }

  function writeMetrics(answer: GetEvaluationResultsResponse): void {
    metricsTable.tBodies[0]!.replaceChildren(
      ...Object.entries(answer.questions).map(([key, q]) => {
        const tr = row([key, q.type, numberCell(`${q.answered} / ${q.labelled}`), ...METRIC_NAMES.map((m) => numberCell(q.metrics[m] === undefined ? "–" : q.metrics[m]!.toFixed(3)))]);
        tr.dataset["question"] = key;
        return tr;
      }),
    );
  }

  return {
    load,
    clear() {
      if (timer) clearTimeout(timer);
      chart?.destroy();
      chart = undefined;
      table.tBodies[0]!.replaceChildren();
      metricsTable.tBodies[0]!.replaceChildren();
      reliabilityTable.tBodies[0]!.replaceChildren();
      results.hidden = true;
      error.textContent = "";
    },
  };
}
