import type { SearchRequest } from "../gen/typesafe/search/v1/search_service_pb.js";
import { UNICODE_RULE, hasLoneSurrogate, type Violation } from "../validation.js";
import { validateFilters, type SafeLevel } from "./filters.js";

/** Every source id of the contract; the search engine knows which are configured. */
export const SOURCE_IDS = ["brave", "exa", "wikipedia", "hackernews", "stackoverflow", "github", "arxiv", "gdelt"] as const;
export type SourceId = (typeof SOURCE_IDS)[number];
export const WINDOWS = ["any", "24h", "7d", "30d"] as const;
export type SearchWindow = (typeof WINDOWS)[number];
export const MAX_QUERY_CHARS = 300;

/**
 * The request rules of the search contract, checked before any money moves.
 * The query length counts code points, so an emoji is one character.
 */
export function validateSearchRequest(request: SearchRequest, minSafe: SafeLevel = "off"): Violation[] {
  const violations: Violation[] = [];
  const length = [...request.q].length;
  if (hasLoneSurrogate(request.q)) {
    violations.push({ field: "q", rule: UNICODE_RULE });
  } else if (request.q.trim() === "") {
    violations.push({ field: "q", rule: "is required: a non-empty query" });
  } else if (length > MAX_QUERY_CHARS) {
    violations.push({ field: "q", rule: `must be at most ${MAX_QUERY_CHARS} characters, got ${length}` });
  }
  if (request.w !== "" && !(WINDOWS as readonly string[]).includes(request.w)) {
    violations.push({ field: "w", rule: `must be one of ${WINDOWS.join(", ")}` });
  }
  const unknown = request.s.filter((id) => !(SOURCE_IDS as readonly string[]).includes(id));
  if (unknown.length > 0) {
    violations.push({
      field: "s",
      rule: `unknown source ids ${unknown.map((id) => JSON.stringify(id)).join(", ")}; allowed: ${SOURCE_IDS.join(", ")}`,
    });
  }
  const duplicate = request.s.find((id, index) => request.s.indexOf(id) !== index);
  if (duplicate !== undefined) {
    violations.push({ field: "s", rule: `lists "${duplicate}" twice` });
  }
  violations.push(...validateFilters(request, minSafe));
  return violations;
}

/**
 * A rule of the JSON form only: proto3 cannot tell an empty `s` from an absent
 * one, so a JSON caller who sends `"s": []` is told instead of getting the
 * defaults. The gateway and Connect JSON both apply it (gRPC cannot send it).
 */
export function findSearchJsonViolation(json: Record<string, unknown>): Violation | undefined {
  return Array.isArray(json["s"]) && json["s"].length === 0
    ? { field: "s", rule: "must list at least one source id when given; omit it for the defaults" }
    : undefined;
}
