import { CategoryScale, Chart, Tooltip } from "chart.js";
import { MatrixController, MatrixElement } from "chartjs-chart-matrix";
import type { QuestionResults } from "../../gen/typesafe/account/v1/account_service_pb.js";
import { numberCell, row } from "./dom.js";

Chart.register(MatrixController, MatrixElement, CategoryScale, Tooltip);

/** One cell of the matrix: the predicted label (x), the expected one (y), how many answers. */
interface Cell {
  x: string;
  y: string;
  v: number;
}

/**
 * Draws a question's confusion matrix (expected label down, predicted label
 * across, each cell shaded by its count) and writes the same counts into the
 * table beside it, for readers who cannot see the canvas. Answers the chart,
 * to be destroyed before the next one is drawn.
 */
export function drawConfusion(canvas: HTMLCanvasElement, table: HTMLTableElement, key: string, question: QuestionResults): Chart<"matrix", Cell[]> {
  const labels = question.labels;
  table.caption!.textContent = `Confusion matrix of ${key}: rows are the expected labels, columns the predicted ones`;
  const head = document.createElement("tr");
  const corner = document.createElement("th");
  corner.scope = "col";
  corner.textContent = "Expected / predicted";
  head.append(corner);
  for (const label of labels) {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = label;
    head.append(th);
  }
  table.tHead!.replaceChildren(head);
  table.tBodies[0]!.replaceChildren(
    ...question.confusion.map((r) => {
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = r.label;
      return row([th, ...r.counts.map((count) => numberCell(String(count)))]);
    }),
  );
  const cells: Cell[] = question.confusion.flatMap((r) => r.counts.map((v, i) => ({ x: labels[i]!, y: r.label, v })));
  const most = Math.max(1, ...cells.map((c) => c.v));
  return new Chart<"matrix", Cell[]>(canvas, {
    type: "matrix",
    data: {
      datasets: [
        {
          label: "answers",
          data: cells,
          backgroundColor: (ctx) => `rgba(11, 92, 173, ${0.08 + (0.92 * ((ctx.raw as Cell | undefined)?.v ?? 0)) / most})`,
          borderColor: "#6e7781",
          borderWidth: 1,
          width: ({ chart }) => (chart.chartArea?.width ?? 0) / labels.length - 2,
          height: ({ chart }) => (chart.chartArea?.height ?? 0) / labels.length - 2,
        },
      ],
    },
    options: {
      animation: false,
      maintainAspectRatio: false,
      plugins: { legend: { display: false }, tooltip: { callbacks: { label: (ctx) => `expected ${(ctx.raw as Cell).y}, predicted ${(ctx.raw as Cell).x}: ${(ctx.raw as Cell).v}` } } },
      scales: {
        x: { type: "category", labels, offset: true, title: { display: true, text: "predicted" }, grid: { display: false } },
        y: { type: "category", labels, offset: true, title: { display: true, text: "expected" }, grid: { display: false } },
      },
    },
  });
}
