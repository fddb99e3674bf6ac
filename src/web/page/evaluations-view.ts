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
 * its table, the spread of its label mass and its largest errors; what
 * answered, and the results as a CSV download; then fit a calibration of that question and compare it with the
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
  const answeredBy = byId("evaluation-answered-by", HTMLElement);
  const resultsCsv = byId("evaluation-results-csv", HTMLAnchorElement);
  const labelMassTable = byId("label-mass-table", HTMLTableElement);
  const largestErrorsTable = byId("largest-errors-table", HTMLTableElement);
  const dialog = byId("evaluation-dialog", HTMLDialogElement);
  const dialogCapBox = byId("evaluation-dialog-cap-box", HTMLElement);
  const dialogCap = byId("evaluation-dialog-cap", HTMLInputElement);
  const dialogConfirm = byId("evaluation-dialog-confirm", HTMLButtonElement);
  const calibrations = createCalibrationsView(options);
  let asked: { action: EvaluationAction; evaluation: Evaluation } | undefined;
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
  dialog.addEventListener("close", () => {
    const what = asked;
    asked = undefined;
    if (dialog.returnValue !== "confirm" || !what) return;
    error.textContent = "";
    void act(what.action, what.evaluation).catch((err: unknown) => options.fail(err, error));
  });

  /** Asks before a change of state: what it does, and for a resume the new cap. */
  function ask(action: EvaluationAction, evaluation: Evaluation): void {
    asked = { action, evaluation };
    const name = evaluationName(evaluation);
    const spent = `It has charged ${formatCredits(evaluation.chargedCredits)} of its ${formatCredits(evaluation.creditCapCredits)} credits cap.`;
    const text: Record<EvaluationAction, [string, string, string]> = {
      cancel: ["Cancel this evaluation?", `No new example of ${name} starts; those in flight finish and are charged. ${spent} A cancelled evaluation cannot be resumed.`, "Cancel evaluation"],
      resume: [
        "Resume this evaluation?",
        `${name} stopped: ${evaluation.stopReason === "CREDIT_CAP" ? "its credit cap was reached. Raise the cap, or it stops again at once" : "the account's balance ran out. Add credits first, or it stops again at once"}. ${spent}`,
        "Resume",
      ],
      delete: ["Delete this evaluation?", `${name} and its results are removed. What it was charged stays in the usage.`, "Delete evaluation"],
    };
    const [title, body, confirm] = text[action];
    byId("evaluation-dialog-title", HTMLElement).textContent = title;
    byId("evaluation-dialog-text", HTMLElement).textContent = body;
    dialogConfirm.textContent = confirm;
    dialogConfirm.className = action === "delete" ? "danger" : "";
    dialogCapBox.hidden = action !== "resume";
    dialogCap.value = "";
    dialog.returnValue = "";
    dialog.showModal();
  }

  async function act(action: EvaluationAction, evaluation: Evaluation): Promise<void> {
    const evaluationId = evaluation.id;
    if (action === "cancel") await client.cancelEvaluation({ evaluationId });
    else if (action === "resume") await client.resumeEvaluation({ evaluationId, creditCapCredits: dialogCap.value === "" ? 0 : Number(dialogCap.value) });
    else await client.deleteEvaluation({ evaluationId });
    await load();
  }

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
    const actions = document.createElement("td");
    actions.className = "actions";
    actions.append(show);
    const state = evaluation.state;
    if (state === "stopped") actions.append(actionButton("Resume", "resume", evaluation));
    if (state === "running" || state === "stopped") actions.append(actionButton("Cancel", "cancel", evaluation));
    if (state !== "running") actions.append(actionButton("Delete", "delete", evaluation));
    const tr = row([
      evaluation.name,
      evaluation.state + (evaluation.stopReason ? ` (${evaluation.stopReason})` : ""),
      numberCell(`${progress.done + progress.failed} / ${progress.total}`),
      numberCell(progress.examplesPerSecond.toFixed(1)),
      numberCell(progress.secondsLeft === undefined ? "–" : formatSeconds(progress.secondsLeft)),
      numberCell(formatCredits(evaluation.chargedCredits)),
      actions,
    ]);
    tr.dataset["id"] = evaluation.id;
    tr.dataset["state"] = evaluation.state;
    return tr;
  }

  function actionButton(label: string, action: EvaluationAction, evaluation: Evaluation): HTMLButtonElement {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "secondary";
    button.textContent = label;
    button.setAttribute("aria-label", `${label} ${evaluationName(evaluation)}`);
    button.addEventListener("click", () => ask(action, evaluation));
    return button;
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
    writeAnsweredBy(shown);
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
    writeLabelMass(key, question);
    writeLargestErrors(key, question);
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

  /** What answered, and the CSV link once there are results to download (finished, or stopped or cancelled after some answers). */
  function writeAnsweredBy(answer: GetEvaluationResultsResponse): void {
    const evaluation = answer.evaluation!;
    answeredBy.textContent =
      answer.upstream === "" ? "No example has been answered yet." : `Answered by model ${answer.model}, upstream ${answer.upstream}, prompt version ${answer.promptVersion}.`;
    resultsCsv.hidden = evaluation.state === "running" || evaluation.progress!.done === 0;
    resultsCsv.href = `/account/v1/evaluations/results.csv?evaluation_id=${encodeURIComponent(evaluation.id)}`;
    resultsCsv.setAttribute("aria-label", `Download results (CSV) of ${evaluationName(evaluation)}`);
  }

  /** The spread of x_label_mass: how much of the model's probability the question's labels held. */
  function writeLabelMass(key: string, question: QuestionResults): void {
    labelMassTable.caption!.textContent = `Label mass of ${key}: how much of the model's probability its labels held (x_label_mass)`;
    const mass = question.labelMass;
    labelMassTable.tBodies[0]!.replaceChildren(
      mass
        ? row([numberCell(String(mass.count)), ...[mass.mean, mass.min, mass.p10, mass.median, mass.p90, mass.max].map((v) => numberCell(v.toFixed(3)))])
        : emptyRow(labelMassTable, "No answer reported its label mass."),
    );
  }

  /** The drill-down: the examples the answers got most wrong, largest error first, as the results give them. */
  function writeLargestErrors(key: string, question: QuestionResults): void {
    largestErrorsTable.caption!.textContent = `Largest errors of ${key}, largest first: the example's line in the uploaded file, its label and the most probable answer`;
    const errors = question.largestErrors;
    largestErrorsTable.tBodies[0]!.replaceChildren(
      ...(errors.length > 0
        ? errors.map((e) => row([numberCell(String(e.line)), e.expected, e.predicted, numberCell(e.error.toFixed(3))]))
        : [emptyRow(largestErrorsTable, "No answered example.")]),
    );
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
      if (dialog.open) dialog.close();
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
      labelMassTable.tBodies[0]!.replaceChildren();
      largestErrorsTable.tBodies[0]!.replaceChildren();
      answeredBy.textContent = "";
      resultsCsv.hidden = true;
      results.hidden = true;
      error.textContent = "";
    },
  };
}

/** What a member may do to an evaluation from its row. */
type EvaluationAction = "cancel" | "resume" | "delete";

/** An evaluation as its row names it: its name, else its id. */
function evaluationName(evaluation: Evaluation): string {
  return evaluation.name === "" ? `evaluation ${evaluation.id}` : evaluation.name;
}
