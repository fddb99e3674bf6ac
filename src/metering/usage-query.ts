import { isUuid } from "../validation.js";
import { throwIfInvalid, type Violation } from "../validation.js";
import type { Endpoint } from "./ledger.js";
import type { CallCursor, CallFilter } from "./account-views.js";

/** Page sizes of the account area's lists: 1 to MAX_PAGE_SIZE, 0 meaning DEFAULT_PAGE_SIZE. */
export const DEFAULT_PAGE_SIZE = 50;
export const MAX_PAGE_SIZE = 500;

/** The endpoints usage can be filtered by. */
export const USAGE_ENDPOINTS: readonly string[] = ["decide", "search"];

/** The times PostgreSQL and the page tokens both hold: years 1 to 9999 (UTC). */
const FIRST_YEAR_MS = new Date("0001-01-01T00:00:00Z").getTime();
const AFTER_LAST_YEAR_MS = new Date("+010000-01-01T00:00:00Z").getTime();

/** A time a caller sent, checked: an invalid or out-of-range one is a 400 naming its field, never a database error. */
export function checkedTime(date: Date | undefined, field: string): Date | undefined {
  if (date === undefined) return undefined;
  const ms = date.getTime();
  throwIfInvalid(Number.isNaN(ms) || ms < FIRST_YEAR_MS || ms >= AFTER_LAST_YEAR_MS ? [{ field, rule: "a time between the years 1 and 9999" }] : []);
  return date;
}

/** The usage filter of a request (RPC or CSV query), checked: a bad field is a 400 naming it. */
export function usageFilter(input: { endpoint: string; since?: Date; until?: Date; keyId?: string }): CallFilter {
  const violations: Violation[] = [];
  const keyId = input.keyId ?? "";
  if (keyId !== "" && !isUuid(keyId)) violations.push({ field: "key_id", rule: "the id of a key (ListKeys), or empty for every key" });
  if (input.endpoint !== "" && !USAGE_ENDPOINTS.includes(input.endpoint)) violations.push({ field: "endpoint", rule: 'one of "decide", "search" or empty' });
  if (input.since && input.until && input.since.getTime() >= input.until.getTime()) violations.push({ field: "since", rule: "must be before until" });
  throwIfInvalid(violations);
  return { endpoint: input.endpoint === "" ? undefined : (input.endpoint as Endpoint), since: input.since, until: input.until, keyId: keyId === "" ? undefined : keyId };
}


/** The page size a request asked for, checked. */
export function pageSize(size: number, field = "page_size"): number {
  if (size === 0) return DEFAULT_PAGE_SIZE;
  throwIfInvalid(size < 0 || size > MAX_PAGE_SIZE ? [{ field, rule: `from 1 to ${MAX_PAGE_SIZE}, or 0 for ${DEFAULT_PAGE_SIZE}` }] : []);
  return size;
}

/**
 * Page tokens are opaque to callers: the base64url of the last row's time and
 * id. They carry no account: the query they resume is filtered by the
 * caller's account as every other, so a token cannot reach another's rows.
 */
export function encodePageToken(at: Date, id: string): string {
  return Buffer.from(JSON.stringify([at.toISOString(), id])).toString("base64url");
}

/** The position a page token names; a token this service did not make is a 400. */
export function decodePageToken(token: string, field = "page_token"): { at: Date; id: string } | undefined {
  if (token === "") return undefined;
  try {
    const parsed: unknown = JSON.parse(Buffer.from(token, "base64url").toString("utf8"));
    if (Array.isArray(parsed) && parsed.length === 2 && typeof parsed[0] === "string" && typeof parsed[1] === "string") {
      const at = new Date(parsed[0]);
      const ms = at.getTime();
      if (ms >= FIRST_YEAR_MS && ms < AFTER_LAST_YEAR_MS && /^[0-9a-f-]{1,36}$/i.test(parsed[1])) return { at, id: parsed[1] };
    }
  } catch {
    // falls through to the 400
  }
  throwIfInvalid([{ field, rule: "the next_page_token of an earlier page" }]);
  return undefined;
}

/** The largest id a bigint column holds. */
const MAX_BIGINT = 2n ** 63n - 1n;

/** An activity page token's position; its id must be an event's (a bigint). */
export function activityCursor(token: string): { at: Date; id: string } | undefined {
  const position = decodePageToken(token);
  if (!position) return undefined;
  throwIfInvalid(/^\d{1,19}$/.test(position.id) && BigInt(position.id) <= MAX_BIGINT ? [] : [{ field: "page_token", rule: "the next_page_token of an earlier page" }]);
  return position;
}

/** A keys page token's position; its id must be a key's (a uuid). */
export function keyCursor(token: string): { at: Date; id: string } | undefined {
  const position = decodePageToken(token);
  if (!position) return undefined;
  throwIfInvalid(isUuid(position.id) ? [] : [{ field: "page_token", rule: "the next_page_token of an earlier page" }]);
  return position;
}

/** A usage page token as the metering view's cursor; the id must be a request's (a uuid). */
export function callCursor(token: string): CallCursor | undefined {
  const position = decodePageToken(token);
  if (!position) return undefined;
  throwIfInvalid(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(position.id) ? [] : [{ field: "page_token", rule: "the next_page_token of an earlier page" }]);
  return { startedAt: position.at, requestId: position.id };
}
