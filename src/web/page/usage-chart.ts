import { timestampDate } from "@bufbuild/protobuf/wkt";
import { BarController, BarElement, CategoryScale, Chart, Legend, LinearScale, LineController, LineElement, PointElement, Tooltip, type ChartDataset } from "chart.js";
import type { UsageBucket } from "../../gen/typesafe/account/v1/account_service_pb.js";
import { formatCredits, numberCell, row } from "./dom.js";

// Only the pieces this chart draws, so the bundle carries no unused chart types.
Chart.register(BarController, BarElement, LineController, LineElement, PointElement, CategoryScale, LinearScale, Legend, Tooltip);

const DAY_MS = 86_400_000;
/** Endpoints always shown, so an idle one reads as zero rather than missing. */
const KNOWN_ENDPOINTS = ["decide", "search"];
const ENDPOINT_NAMES: Record<string, string> = { decide: "Decisions", search: "Search" };
const COLORS = ["#0b5cad", "#8250df", "#1a7f37", "#bc4c00"];

/** Calls and credits per UTC day and endpoint, every day of the range present (zero when idle). */
export interface DailyUsage {
  /** "YYYY-MM-DD", oldest first. */
  days: string[];
  endpoints: string[];
  calls: Record<string, number[]>;
  credits: Record<string, number[]>;
}

/** Spreads the summary's buckets (days with calls only) over the `dayCount` UTC days that end on `until`'s day. */
export function dailyUsage(buckets: UsageBucket[], until: Date, dayCount: number): DailyUsage {
  const lastDay = Math.floor(until.getTime() / DAY_MS);
  const days = Array.from({ length: dayCount }, (_, i) => new Date((lastDay - dayCount + 1 + i) * DAY_MS).toISOString().slice(0, 10));
  const endpoints = [...new Set([...KNOWN_ENDPOINTS, ...buckets.map((b) => b.endpoint)])];
  const calls: Record<string, number[]> = {};
  const credits: Record<string, number[]> = {};
  for (const endpoint of endpoints) {
    calls[endpoint] = days.map(() => 0);
    credits[endpoint] = days.map(() => 0);
  }
  for (const bucket of buckets) {
    if (!bucket.start) continue;
    const index = days.indexOf(timestampDate(bucket.start).toISOString().slice(0, 10));
    if (index < 0) continue;
    calls[bucket.endpoint]![index]! += bucket.calls;
    credits[bucket.endpoint]![index]! += bucket.chargedCredits;
  }
  return { days, endpoints, calls, credits };
}

let drawn: Chart | undefined;

/**
 * Draws the usage chart (bars: calls, stacked by endpoint; lines: credits
 * charged, on their own axis) and writes the very data the chart holds into
 * the table beside it, for readers who cannot see the canvas.
 */
export function drawUsageChart(canvas: HTMLCanvasElement, table: HTMLTableElement, summary: HTMLElement, usage: DailyUsage): void {
  const datasets: Array<ChartDataset<"bar" | "line", number[]>> = [];
  usage.endpoints.forEach((endpoint, i) => {
    const name = ENDPOINT_NAMES[endpoint] ?? endpoint;
    const color = COLORS[i % COLORS.length]!;
    datasets.push({ type: "bar", label: `${name}: calls`, data: usage.calls[endpoint]!, backgroundColor: color, stack: "calls", yAxisID: "calls" });
  });
  usage.endpoints.forEach((endpoint, i) => {
    const name = ENDPOINT_NAMES[endpoint] ?? endpoint;
    const color = COLORS[i % COLORS.length]!;
    datasets.push({ type: "line", label: `${name}: credits`, data: usage.credits[endpoint]!, borderColor: color, backgroundColor: color, borderDash: [6, 4], pointRadius: 2, yAxisID: "credits" });
  });
  drawn?.destroy();
  drawn = new Chart(canvas, {
    type: "bar",
    data: { labels: usage.days.map((day) => day.slice(5)), datasets },
    options: {
      animation: false,
      maintainAspectRatio: false,
      interaction: { mode: "index", intersect: false },
      scales: {
        calls: { type: "linear", position: "left", beginAtZero: true, stacked: true, title: { display: true, text: "calls" }, ticks: { precision: 0 } },
        credits: { type: "linear", position: "right", beginAtZero: true, title: { display: true, text: "credits" }, grid: { drawOnChartArea: false } },
        x: { stacked: true },
      },
    },
  });
  writeTable(table, drawn, usage.days);
  const totalCalls = usage.endpoints.reduce((sum, e) => sum + usage.calls[e]!.reduce((a, b) => a + b, 0), 0);
  const totalCredits = usage.endpoints.reduce((sum, e) => sum + usage.credits[e]!.reduce((a, b) => a + b, 0), 0);
  summary.textContent = `${totalCalls} ${totalCalls === 1 ? "call" : "calls"} and ${formatCredits(totalCredits)} credits charged from ${usage.days[0]} to ${usage.days.at(-1)}.`;
}

/** One row per day, one column per dataset, read back from the chart itself. */
function writeTable(table: HTMLTableElement, chart: Chart, days: string[]): void {
  const head = table.tHead!;
  const body = table.tBodies[0]!;
  const th = (text: string, scope: "col" | "row") => {
    const cell = document.createElement("th");
    cell.scope = scope;
    cell.textContent = text;
    return cell;
  };
  const headRow = document.createElement("tr");
  headRow.append(th("Day", "col"), ...chart.data.datasets.map((d) => th(d.label ?? "", "col")));
  head.replaceChildren(headRow);
  body.replaceChildren(
    ...days.map((day, i) => {
      const tr = row(chart.data.datasets.map((d) => numberCell(formatCredits(Number(d.data[i] ?? 0)))));
      tr.prepend(th(day, "row"));
      tr.dataset["day"] = day;
      return tr;
    }),
  );
}
