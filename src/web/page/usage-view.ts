import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import type { UsageRecord } from "../../gen/typesafe/account/v1/account_service_pb.js";
import type { AccountClient } from "./client.js";
import { byId, emptyRow, formatCredits, numberCell, row, timeElement } from "./dom.js";

const PAGE_SIZE = 25;
const DAY_MS = 86_400_000;
/** The CSV of the same rows: a plain download link, answered by the service with the session cookie. */
const CSV_PATH = "/account/v1/usage.csv";

/** What the usage view needs from the page. */
export interface UsageViewOptions {
  client: AccountClient;
  fail(err: unknown, where: HTMLElement): void;
  /** The readable name of a key id ("ci (ts_…abcd)"), or undefined when unknown. */
  keyName(keyId: string): string | undefined;
}

/** The usage view: finished calls newest first, a page at a time, filtered by endpoint and period, with a CSV of the same filter. */
export function createUsageView(options: UsageViewOptions): { load(): Promise<void>; clear(): void } {
  const { client } = options;
  const form = byId("usage-filter", HTMLFormElement);
  const endpoint = byId("usage-endpoint", HTMLSelectElement);
  const days = byId("usage-days", HTMLSelectElement);
  const csv = byId("usage-csv", HTMLAnchorElement);
  const error = byId("usage-error", HTMLElement);
  const table = byId("usage-table", HTMLTableElement);
  const first = byId("usage-first", HTMLButtonElement);
  const next = byId("usage-next", HTMLButtonElement);
  const pageLabel = byId("usage-page", HTMLElement);
  /** The token of the page shown ("" for the first) and of the next one. */
  let pageToken = "";
  let nextToken = "";
  let pageNumber = 1;
  let since: Date | undefined;

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    void show("", 1);
  });
  first.addEventListener("click", () => void show("", 1));
  next.addEventListener("click", () => void show(nextToken, pageNumber + 1));

  function usageRow(record: UsageRecord): HTMLTableRowElement {
    const tr = row([
      timeElement(record.startedAt ? timestampDate(record.startedAt) : undefined, ""),
      record.endpoint,
      options.keyName(record.keyId) ?? record.keyId,
      record.funding,
      numberCell(formatCredits(record.reservedCredits)),
      numberCell(formatCredits(record.chargedCredits)),
      record.status,
      record.requestId,
    ]);
    tr.dataset["requestId"] = record.requestId;
    return tr;
  }

  async function show(token: string, number: number): Promise<void> {
    error.textContent = "";
    if (token === "") {
      // A new first page fixes the period, so later pages continue the same list.
      since = days.value === "" ? undefined : new Date(Date.now() - Number(days.value) * DAY_MS);
      csv.href = csvHref(endpoint.value, since);
    }
    try {
      const page = await client.listUsage({
        endpoint: endpoint.value,
        since: since ? timestampFromDate(since) : undefined,
        pageSize: PAGE_SIZE,
        pageToken: token,
      });
      pageToken = token;
      nextToken = page.nextPageToken;
      pageNumber = number;
      table.tBodies[0]!.replaceChildren(...(page.records.length > 0 ? page.records.map(usageRow) : [emptyRow(table, "No calls in this period.")]));
      first.disabled = pageToken === "";
      next.disabled = nextToken === "";
      pageLabel.textContent = `Page ${pageNumber}`;
    } catch (err) {
      options.fail(err, error);
    }
  }

  return {
    load: () => show("", 1),
    clear() {
      table.tBodies[0]!.replaceChildren();
      pageToken = nextToken = "";
      error.textContent = "";
    },
  };
}

/** The CSV link for a filter: `endpoint` and `since` (RFC 3339) as query parameters, empty ones left out. */
export function csvHref(endpoint: string, since: Date | undefined): string {
  const query = new URLSearchParams();
  if (endpoint) query.set("endpoint", endpoint);
  if (since) query.set("since", since.toISOString());
  const text = query.toString();
  return text ? `${CSV_PATH}?${text}` : CSV_PATH;
}
