import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { Account } from "../../gen/typesafe/account/v1/account_service_pb.js";
import type { AccountClient } from "./client.js";
import { byId, formatCredits } from "./dom.js";
import { dailyUsage, drawUsageChart } from "./usage-chart.js";

const CHART_DAYS = 30;
const DAY_MS = 86_400_000;

/** Writes the account's figures: balance, holds, free requests, calls in flight and the limits. */
export function showAccount(account: Account): void {
  byId("account-name", HTMLElement).textContent = account.name;
  byId("balance", HTMLElement).textContent = formatCredits(account.balanceCredits);
  byId("held", HTMLElement).textContent = formatCredits(account.heldCredits);
  byId("available", HTMLElement).textContent = formatCredits(account.availableCredits);
  byId("free-requests", HTMLElement).textContent = String(account.freeRequestsRemaining);
  byId("in-flight", HTMLElement).textContent = String(account.callsInFlight);
  const limits = account.limits;
  byId("limits", HTMLElement).textContent = limits ? `${limits.maxInFlight} in flight, ${limits.requestsPerMinute} a minute` : "";
  byId("low-balance", HTMLElement).hidden = !account.balanceLow;
}

/** The overview: the account's figures and the last 30 days of usage as a chart. */
export async function loadOverview(client: AccountClient): Promise<void> {
  const until = new Date();
  const since = new Date((Math.floor(until.getTime() / DAY_MS) - CHART_DAYS + 1) * DAY_MS);
  const [{ account }, summary] = await Promise.all([
    client.getAccount({}),
    client.getUsageSummary({ since: timestampFromDate(since), until: timestampFromDate(until), granularity: "day" }),
  ]);
  if (account) showAccount(account);
  drawUsageChart(
    byId("usage-chart", HTMLCanvasElement),
    byId("chart-table", HTMLTableElement),
    byId("chart-summary", HTMLElement),
    dailyUsage(summary.buckets, until, CHART_DAYS),
  );
}
