import crypto from "node:crypto";
import type { Knex } from "knex";
import { apiError } from "../errors.js";
import { sendError, type NodeRequest, type NodeResponse } from "../gateway/envelope.js";
import { listFinishedCalls, type FinishedCall } from "../metering/account-views.js";
import { observeCall, type CallObserver } from "../rpc/observe.js";
import { requestHeaders } from "../rpc/node-headers.js";
import { unitsToCredits } from "../units.js";
import { throwIfInvalid } from "../validation.js";
import { kMember, openAccountDoor, type AccountDoorOptions } from "./door.js";
import { checkedTime, usageFilter } from "./usage-query.js";
import { createContextValues } from "@connectrpc/connect";

/** Where the CSV download of ListUsage's rows is served. */
export const USAGE_CSV_PATH = "/account/v1/usage.csv";
/** The most rows one download holds (newest first); narrow the range for older ones. */
export const MAX_CSV_ROWS = 100_000;
const PAGE_ROWS = 1_000;

const COLUMNS = ["request_id", "endpoint", "key_id", "funding", "reserved_credits", "charged_credits", "status", "started_at", "finished_at"];

/**
 * GET /account/v1/usage.csv?endpoint=&since=&until= : the rows ListUsage
 * pages through, as one CSV file (RFC 4180). The same door as the RPCs
 * (origin, session cookie), the same filters, the same account filter in SQL,
 * and the same log line per call.
 */
export function createUsageCsvHandler(deps: { db: Knex; door: AccountDoorOptions; observer: CallObserver }) {
  return (req: NodeRequest, res: NodeResponse): void => {
    const requestId = crypto.randomUUID();
    const headers = { "x-request-id": requestId, "cache-control": "no-store" };
    void observeCall(deps.observer, { requestId, procedure: USAGE_CSV_PATH, protocol: "gateway" }, async () => {
      if (req.method !== "GET") throw apiError("METHOD_NOT_ALLOWED", `${USAGE_CSV_PATH} accepts GET`, { metadata: { allow: "GET" } });
      const values = createContextValues();
      await openAccountDoor(deps.door, { methodName: "UsageCsv", header: requestHeaders(req), values });
      const member = values.get(kMember)!;
      const query = new URL(req.url ?? "/", "http://localhost").searchParams;
      const filter = usageFilter({ endpoint: query.get("endpoint") ?? "", since: queryDate(query, "since"), until: queryDate(query, "until") });
      res.writeHead(200, {
        ...headers,
        "content-type": "text/csv; charset=utf-8; header=present",
        "content-disposition": 'attachment; filename="usage.csv"',
      });
      res.write(COLUMNS.join(",") + "\r\n");
      let after: { startedAt: Date; requestId: string } | undefined;
      for (let written = 0; written < MAX_CSV_ROWS; ) {
        const { calls, more } = await listFinishedCalls(deps.db, member.accountId, filter, { size: Math.min(PAGE_ROWS, MAX_CSV_ROWS - written), after });
        res.write(calls.map(csvLine).join(""));
        written += calls.length;
        const last = calls.at(-1);
        if (!more || !last) break;
        after = { startedAt: last.startedAt, requestId: last.requestId };
      }
      res.end();
    }).catch((err: unknown) => {
      if (res.headersSent) return void res.destroy();
      if (req.method !== "GET") res.setHeader("allow", "GET");
      sendError(res, err, headers);
    });
  };
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

/**
 * One field as RFC 4180 writes it: quoted when it holds a comma, semicolon
 * (some spreadsheets' separator), quote or line break, quotes doubled. Every
 * field a spreadsheet could read as a formula (=, +, -, @, tab or CR first)
 * is quoted with a leading apostrophe, as OWASP's CSV injection page says:
 * without exceptions, since "-1+1|cmd" starts like a number.
 */
export function csvField(value: string): string {
  const safe = /^[=+\-@\t\r]/.test(value) ? `'${value}` : value;
  return /[",;\r\n]/.test(safe) || safe !== value ? `"${safe.replaceAll('"', '""')}"` : safe;
}

function queryDate(query: URLSearchParams, name: string): Date | undefined {
  const raw = query.get(name);
  if (raw === null || raw === "") return undefined;
  const date = new Date(raw);
  throwIfInvalid(Number.isNaN(date.getTime()) || !/^\d{4}-\d{2}-\d{2}/.test(raw) ? [{ field: name, rule: "an RFC 3339 time, e.g. 2026-11-26T00:00:00Z" }] : []);
  return checkedTime(date, name);
}
