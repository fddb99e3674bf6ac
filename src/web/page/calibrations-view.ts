import type { Calibration, HeldOutMetrics } from "../../gen/typesafe/account/v1/account_service_pb.js";
import type { AccountClient } from "./client.js";
import { byId, emptyRow, numberCell, row } from "./dom.js";

/** The fit methods each question type takes, as FitCalibration names them. */
export const METHODS_OF_TYPE: Record<string, ReadonlyArray<{ method: string; name: string }>> = {
  noul: [
    { method: "platt", name: "Platt scaling" },
    { method: "isotonic", name: "Isotonic regression" },
  ],
  choice: [
    { method: "temperature", name: "Temperature scaling" },
    { method: "vector", name: "Vector scaling (temperature and a bias per label)" },
  ],
  score: [
    { method: "temperature", name: "Temperature scaling" },
    { method: "vector", name: "Vector scaling (temperature and a bias per label)" },
  ],
};

const HELD_OUT: ReadonlyArray<[keyof Omit<HeldOutMetrics, "$typeName" | "$unknown" | "count">, string]> = [
  ["ece", "ECE"],
  ["brier", "Brier"],
  ["logLoss", "Log loss"],
  ["accuracy", "Accuracy"],
];

export interface CalibrationsViewOptions {
  client: AccountClient;
  fail(err: unknown, where: HTMLElement): void;
}

/**
 * Fitting calibrations and the account's list of them: a fit takes one
 * question of a finished evaluation and a method of its type; each
 * calibration shows its held-out metrics before and after, so a member sees
 * what it buys before naming it in a decision.
 */
export function createCalibrationsView(options: CalibrationsViewOptions) {
  const { client } = options;
  const form = byId("calibration-form", HTMLFormElement);
  const method = byId("calibration-method", HTMLSelectElement);
  const status = byId("calibration-status", HTMLElement);
  const error = byId("calibrations-error", HTMLElement);
  const table = byId("calibrations-table", HTMLTableElement);
  let target: { evaluationId: string; questionKey: string } | undefined;

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    error.textContent = "";
    status.textContent = "";
    void fit().catch((err: unknown) => options.fail(err, error));
  });

  async function fit(): Promise<void> {
    if (!target) return;
    const { calibration } = await client.fitCalibration({ ...target, method: method.value });
    status.textContent = `Fitted ${calibration!.questionKey}, version ${calibration!.version}: held-out ECE ${metric(calibration!.heldOut?.before?.ece)} before, ${metric(calibration!.heldOut?.after?.ece)} after.`;
    await load();
  }

  function calibrationRow(calibration: Calibration): HTMLTableRowElement {
    const { before, after } = calibration.heldOut ?? {};
    const id = document.createElement("code");
    id.textContent = calibration.id;
    const tr = row([
      calibration.questionKey,
      calibration.method,
      numberCell(String(calibration.version)),
      ...HELD_OUT.map(([name]) => numberCell(`${metric(before?.[name])} → ${metric(after?.[name])}`)),
      numberCell(String(after?.count ?? 0)),
      id,
    ]);
    tr.dataset["id"] = calibration.id;
    tr.dataset["question"] = calibration.questionKey;
    return tr;
  }

  async function load(): Promise<void> {
    const { calibrations } = await client.listCalibrations({});
    table.tBodies[0]!.replaceChildren(...(calibrations.length > 0 ? calibrations.map(calibrationRow) : [emptyRow(table, "No calibration yet.")]));
  }

  return {
    load,
    /** The question the fit applies to: the one the results show, of a finished evaluation (none otherwise). */
    target(next: { evaluationId: string; questionKey: string; type: string; finished: boolean } | undefined): void {
      target = next?.finished ? { evaluationId: next.evaluationId, questionKey: next.questionKey } : undefined;
      form.hidden = target === undefined;
      method.replaceChildren(
        ...(METHODS_OF_TYPE[next?.type ?? ""] ?? []).map(({ method: value, name }) => {
          const option = document.createElement("option");
          option.value = value;
          option.textContent = name;
          return option;
        }),
      );
      status.textContent = "";
    },
    clear(): void {
      target = undefined;
      form.hidden = true;
      table.tBodies[0]!.replaceChildren();
      status.textContent = "";
      error.textContent = "";
    },
  };
}

function metric(value: number | undefined): string {
  return value === undefined ? "–" : value.toFixed(3);
}
