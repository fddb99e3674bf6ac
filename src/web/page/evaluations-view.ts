import { Chart, LinearScale, LineController, LineElement, PointElement, ScatterController, Tooltip, Legend } from "chart.js";
import type { Evaluation, GetEvaluationResultsResponse, QuestionResults } from "../../gen/typesafe/account/v1/account_service_pb.js";
import { createCalibrationsView } from "./calibrations-view.js";
import { uploadEvaluation, type AccountClient, type UploadProgress } from "./client.js";
import { drawConfusion } from "./confusion-chart.js";
import { byId, emptyRow, formatBytes, formatCredits, formatSeconds, numberCell, row } from "./dom.js";

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
 * or CSV file of labelled examples (streamed to the upload route), follow its
 * progress, and read its results: a metrics table per question, and for the
 * question chosen the reliability diagram and the confusion matrix, each with
 * its table; then fit a calibration of that question and compare it with the
 * account's others.
 */
export function createEvaluationsView(options: EvaluationsViewOptions): { load(): Promise<void>; clear(): void } {
  const { client } = options;
  const form = byId("evaluation-form", HTMLFormElement);
  const questionsInput = byId("evaluation-questions", HTMLTextAreaElement);
  const fileInput = byId("evaluation-file", HTMLInputElement);
  const capInput = byId("evaluation-cap", HTMLInputElement);
  const uploadStatus = byId("evaluation-upload-status", HTMLElement);
  const upload = byId("evaluation-upload", HTMLElement);
  const uploadBar = byId("evaluation-upload-bar", HTMLProgressElement);
  const uploadBytes = byId("evaluation-upload-bytes", HTMLElement);
  const startButton = form.querySelector<HTMLButtonElement>('button[type="submit"]')!;
  const error = byId("evaluations-error", HTMLElement);
  const table = byId("evaluations-table", HTMLTableElement);
  const results = byId("evaluation-results", HTMLElement);
  const questionSelect = byId("results-question", HTMLSelectElement);
  const metricsTable = byId("evaluation-metrics-table", HTMLTableElement);
  const reliabilityTable = byId("reliability-table", HTMLTableElement);
  const canvas = byId("reliability-chart", HTMLCanvasElement);
  const confusionBox = byId("confusion", HTMLElement);
  const confusionCanvas = byId("confusion-chart", HTMLCanvasElement);
  const confusionTable = byId("confusion-table", HTMLTableElement);
  const calibrations = createCalibrationsView(options);
  let timer: ReturnType<typeof setTimeout> | undefined;
  let chart: Chart | undefined;
  let confusionChart: Chart<"matrix"> | undefined;
  let shown: GetEvaluationResultsResponse | undefined;

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    error.textContent = "";
    startButton.disabled = true;
    void start()
      .catch((err: unknown) => options.fail(err, error))
      .finally(() => {
        uploadStatus.textContent = "";
        upload.hidden = true;
        startButton.disabled = false;
      });
  });
  questionSelect.addEventListener("change", () => showQuestion(questionSelect.value));

  async function start(): Promise<void> {
    const file = fileInput.files?.[0];
    if (!file) {
      error.textContent = "Choose a JSON Lines (.jsonl) or CSV (.csv) file of examples.";
      return;
    }
    const body = new FormData();
    body.set("name", file.name);
    body.set("questions", questionsInput.value);
    body.set("credit_cap_credits", capInput.value);
    body.set("examples", file, file.name);
    uploadStatus.textContent = `Uploading ${file.name} (${formatBytes(file.size)})…`;
    showUpload({ sentBytes: 0, totalBytes: file.size });
    upload.hidden = false;
    let sent = false;
    await uploadEvaluation(location.origin, body, (progress) => {
      showUpload(progress);
      // Announced once, not at every step: the bar carries the figures.
      if (!sent && progress.sentBytes >= progress.totalBytes) {
        sent = true;
        uploadStatus.textContent = `Sent ${file.name}; the service is checking and storing its examples…`;
      }
    });
    form.reset();
    await load();
  }

  /** The upload's bar: bytes of the form sent of its total, as figures beside it and as the bar's value text. */
  function showUpload({ sentBytes, totalBytes }: UploadProgress): void {
    const percent = totalBytes > 0 ? Math.floor((100 * sentBytes) / totalBytes) : 0;
    const text = `${formatBytes(sentBytes)} of ${formatBytes(totalBytes)} (${percent} %)`;
    uploadBar.max = Math.max(totalBytes, 1);
    uploadBar.value = sentBytes;
    uploadBar.setAttribute("aria-valuetext", text);
    uploadBytes.textContent = text;
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
      numberCell(progress.secondsLeft === undefined ? "–" : formatSeconds(progress.secondsLeft)),
      numberCell(formatCredits(evaluation.chargedCredits)),
      show,
    ]);
    tr.dataset["id"] = evaluation.id;
    tr.dataset["state"] = evaluation.state;
    return tr;
  }

  async function load(): Promise<void> {
    if (timer) clearTimeout(timer);
    const [{ evaluations }] = await Promise.all([client.listEvaluations({}), calibrations.load()]);
    const body = table.tBodies[0]!;
    body.replaceChildren(...(evaluations.length > 0 ? evaluations.map(evaluationRow) : [emptyRow(table, "No evaluation yet.")]));
    if (evaluations.some((e) => e.state === "running") && !byId("view-evaluations", HTMLElement).hidden) {
      timer = setTimeout(() => void load().catch((err: unknown) => options.fail(err, error)), REFRESH_MS);
    }
  }

  async function showResults(evaluationId: string): Promise<void> {
    shown = await client.getEvaluationResults({ evaluationId });
    writeMetrics(shown);
    const keys = Object.keys(shown.questions);
    questionSelect.replaceChildren(
      ...keys.map((key) => {
        const option = document.createElement("option");
        option.value = key;
        option.textContent = `${key} (${shown!.questions[key]!.type})`;
        return option;
      }),
    );
    results.hidden = false;
    if (keys[0] !== undefined) showQuestion(keys[0]);
  }

  /** The diagrams of one question of the results shown, and the fit's target. */
  function showQuestion(key: string): void {
    const question = shown?.questions[key];
    if (!shown || !question) return;
    drawReliability(key, question);
    confusionChart?.destroy();
    confusionChart = undefined;
    confusionBox.hidden = question.confusion.length === 0;
    if (question.confusion.length > 0) confusionChart = drawConfusion(confusionCanvas, confusionTable, key, question);
    calibrations.target({ evaluationId: shown.evaluation!.id, questionKey: key, type: question.type, finished: shown.evaluation!.state === "finished" });
  }

  function drawReliability(key: string, question: QuestionResults): void {
    const bins = question.reliability;
    reliabilityTable.caption!.textContent = `Reliability of ${key}: mean predicted probability against observed frequency, per bin`;
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
      confusionChart?.destroy();
      confusionChart = undefined;
      shown = undefined;
      calibrations.clear();
      confusionTable.tBodies[0]!.replaceChildren();
      table.tBodies[0]!.replaceChildren();
      metricsTable.tBodies[0]!.replaceChildren();
      reliabilityTable.tBodies[0]!.replaceChildren();
      results.hidden = true;
      error.textContent = "";
    },
  };
}
