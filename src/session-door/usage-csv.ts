import crypto from "node:crypto";
import type { Knex } from "knex";
import { apiError } from "../errors.js";
import { sendError, type NodeRequest, type NodeResponse } from "../http/envelope.js";
import { listFinishedCalls, type FinishedCall } from "../metering/account-views.js";
import { observeCall, type CallObserver } from "../call/observe.js";
import { requestHeaders } from "../http/node-headers.js";
import { unitsToCredits } from "../units.js";
import { throwIfInvalid } from "../validation.js";
import { allowedMember } from "./access.js";
import { kMember, openAccountDoor, type AccountDoorOptions } from "./door.js";
import { checkedTime, usageFilter } from "../metering/usage-query.js";
import { createContextValues } from "@connectrpc/connect";
import { csvField } from "../csv-field.js";

/** Where the CSV download of ListUsage's rows is served. */
export const USAGE_CSV_PATH = "/account/v1/usage.csv";
/** Rows read from the database at a time: what the export holds in memory, whatever the period's size. */
const PAGE_ROWS = 1_000;

const COLUMNS = ["request_id", "endpoint", "key_id", "funding", "reserved_credits", "charged_credits", "status", "started_at", "finished_at"];

/**
 * GET /account/v1/usage.csv?endpoint=&key_id=&since=&until= : every row
 * ListUsage pages through, as one CSV file (RFC 4180), newest first. The same
 * door as the RPCs (origin, session cookie), the same filters, the same
 * account filter in SQL, and the same log line per call.
 *
 * It streams: the rows are read a page at a time by keyset, each page
 * written before the next is read, and the next read waits while the
 * client's connection is full (back-pressure), so memory stays at one page
 * however long the period. A client that goes away ends the export at its
 * next page. Calls started after the export began (newer than its first
 * row) are not in it; a call still running is not either, until it ends.
 */
export function createUsageCsvHandler(deps: { db: Knex; door: AccountDoorOptions; observer: CallObserver }) {
  return (req: NodeRequest, res: NodeResponse): void => {
    const requestId = crypto.randomUUID();
    const headers = { "x-request-id": requestId, "cache-control": "no-store" };
    let gone = false;
    res.on("close", () => (gone = !res.writableFinished));
    void observeCall(deps.observer, { requestId, procedure: USAGE_CSV_PATH, protocol: "gateway" }, async () => {
      if (req.method !== "GET") throw apiError("METHOD_NOT_ALLOWED", `${USAGE_CSV_PATH} accepts GET`, { metadata: { allow: "GET" } });
      const values = createContextValues();
      await openAccountDoor(deps.door, { methodName: "UsageCsv", header: requestHeaders(req), values });
      const member = allowedMember(values.get(kMember)!, "read");
      const query = new URL(req.url ?? "/", "http://localhost").searchParams;
      const filter = usageFilter({
        endpoint: query.get("endpoint") ?? "",
        since: queryDate(query, "since"),
        until: queryDate(query, "until"),
        keyId: query.get("key_id") ?? "",
      });
      res.writeHead(200, {
        ...headers,
        "content-type": "text/csv; charset=utf-8; header=present",
        "content-disposition": 'attachment; filename="usage.csv"',
      });
      let room = res.write(COLUMNS.join(",") + "\r\n");
      let after: { startedAt: Date; requestId: string } | undefined;
      while (!gone) {
        if (!room) await drainedOrGone(res);
        if (gone) break;
        const { calls, more } = await listFinishedCalls(deps.db, member.accountId, filter, { size: PAGE_ROWS, after });
        room = res.write(calls.map(csvLine).join(""));
        const last = calls.at(-1);
        if (!more || !last) break;
        after = { startedAt: last.startedAt, requestId: last.requestId };
      }
      if (gone) throw apiError("CANCELLED", "the client went away during the export");
      res.end();
    }).catch((err: unknown) => {
      if (res.headersSent) return void res.destroy();
      if (req.method !== "GET") res.setHeader("allow", "GET");
      sendError(res, err, headers);
    });
  };
}

/** Resolves when the response can take more, or when its connection closed. */
function drainedOrGone(res: NodeResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off("drain", done);
      res.off("close", done);
      resolve();
    };
    res.on("drain", done);
    res.on("close", done);
  });
}

function csvLine(call: FinishedCall): string {
  const fields = [
    call.requestId,
    call.endpoint,
    call.keyId,
    call.funding,
    String(unitsToCredits(call.reservedUnits)),
    String(unitsToCredits(call.chargedUnits)),
    call.status,
    call.startedAt.toISOString(),
    call.finishedAt.toISOString(),
  ];
  return fields.map(csvField).join(",") + "\r\n";
}

/** The usage CSV and the evaluation results CSV share one formula guard. */
export { csvField };

function queryDate(query: URLSearchParams, name: string): Date | undefined {
  const raw = query.get(name);
  if (raw === null || raw === "") return undefined;
  const date = new Date(raw);
  throwIfInvalid(Number.isNaN(date.getTime()) || !/^\d{4}-\d{2}-\d{2}/.test(raw) ? [{ field: name, rule: "an RFC 3339 time, e.g. 2026-11-26T00:00:00Z" }] : []);
  return checkedTime(date, name);
}
