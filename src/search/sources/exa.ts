import { callUpstream, endpoint, failForStatus } from "./call-upstream.js";
import { asArray, asNumber, asRecord, asString, requireArray, requireRecord } from "./json-fields.js";
import { readJson } from "./read-answer.js";
import { SourceFailure } from "./source-failure.js";
import type { SearchSource, SourceSettings } from "./types.js";
import { windowCutoffMs } from "./window.js";
import type { FilterPlan, SearchFilters } from "../filters.js";

/** Exa says nothing about when a top-up lands: look again after an hour. */
export const EXA_QUOTA_RECHECK_MS = 3600_000;

/**
 * Exa search. Its window is exact (startPublishedDate is an instant), and
 * every answer states its upstream cost, which we log to check our price list.
 */
export function createExaSource(settings: SourceSettings): SearchSource {
  return {
    id: "exa",
    version: 2,
    planFilters: exaPlan,
    filterParameters: { d: "`includeDomains`", xd: "`excludeDomains` (a `*.` entry: post-filter)", safe: "`moderation: true` for `moderate` and `strict`" },
    async search(call) {
      const body: Record<string, unknown> = {
        query: call.query,
        type: "auto",
        numResults: 10,
        contents: { highlights: { maxCharacters: 400 } },
      };
      const cutoff = windowCutoffMs(call.window, call.nowMs);
      if (cutoff !== undefined) body["startPublishedDate"] = new Date(cutoff).toISOString();
      if (call.filters) Object.assign(body, exaNative(call.filters));
      const res = await callUpstream(settings, endpoint(settings.baseUrl, "/search"), call, {
        method: "POST",
        headers: { Accept: "application/json", "Content-Type": "application/json", "x-api-key": settings.key ?? "" },
        body: JSON.stringify(body),
      });
      // exa.ai/docs/reference/error-codes: 400 is the request's own fault
      // (INVALID_REQUEST_BODY…); 402 is credits exhausted or the key's budget spent.
      if (res.status === 400) throw new SourceFailure("error", "upstream rejected the request", { upstreamFault: false });
      if (res.status === 402) {
        throw new SourceFailure("quota", "the account's credits or the key's budget are used up; top up on the Exa dashboard", { retryAfterMs: EXA_QUOTA_RECHECK_MS });
      }
      failForStatus(res, call.nowMs);
      const answer = requireRecord(await readJson(res));
      const results = requireArray(answer["results"]);
      const cost = asNumber(asRecord(answer["costDollars"])?.["total"]);
      if (cost !== undefined) settings.logger.debug("exa upstream cost", { source: "exa", costDollars: cost });
      return {
        items: results.map((raw) => {
          const r = asRecord(raw) ?? {};
          const published = asString(r["publishedDate"]);
          const url = asString(r["url"]);
          return {
            // Exa sends `title: null` for pages without one; the URL stands in.
            title: asString(r["title"]).trim() === "" ? url : asString(r["title"]),
            url,
            snippet: asArray(r["highlights"]).map(asString).filter((h) => h !== "").join(" … "),
            publishedAt: published === "" ? null : published,
          };
        }),
      };
    },
  };
}

/**
 * The filters as Exa takes them (exa.ai/docs/reference/search): domains in
 * `includeDomains` / `excludeDomains` (a "*." entry to keep goes as its
 * domain, wider, and typesafe's check narrows it; one to drop is left to the
 * check, since Exa's would drop the domain itself too); safe search as
 * `moderation: true`, which filters unsafe content, for moderate and strict.
 * Exa has no language or country filter (userLocation only biases ranking)
 * and states neither per result. It charges by result count, so no larger page.
 */
export function exaNative(filters: SearchFilters): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  if (filters.include.length > 0) body["includeDomains"] = [...new Set(filters.include.map((r) => r.host))];
  const exclude = filters.exclude.filter((r) => !r.subdomainsOnly).map((r) => r.host);
  if (exclude.length > 0) body["excludeDomains"] = exclude;
  if (filters.safe === "moderate" || filters.safe === "strict") body["moderation"] = true;
  return body;
}

export function exaPlan(filters: SearchFilters): FilterPlan {
  return {
    applied: {
      d: "native",
      xd: filters.exclude.every((r) => !r.subdomainsOnly) ? "native" : "post_filtered",
      l: "unsupported",
      c: "unsupported",
      safe: "native",
    },
  };
}
