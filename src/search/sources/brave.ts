import {
  asRecord, asString, callUpstream, endpoint, failForStatus, optionalArray, optionalRecord, readJson, requireRecord,
  type SearchSource, type SourceSettings,
} from "./types.js";
import type { SearchWindow } from "../validate.js";

/** Brave's native windows; `pm` is 31 days, so the engine's post-filter trims it to 30. */
export const BRAVE_FRESHNESS: Record<SearchWindow, string | undefined> = { any: undefined, "24h": "pd", "7d": "pw", "30d": "pm" };

/**
 * Brave Search API, web results. Auth is the X-Subscription-Token header.
 * `page_age` (ISO without zone, UTC) is the date; `age` is human text
 * ("2 days ago") and is never parsed.
 */
export function createBraveSource(settings: SourceSettings): SearchSource {
  return {
    id: "brave",
    version: 1,
    async search(call) {
      const url = endpoint(settings.baseUrl, "/res/v1/web/search");
      url.searchParams.set("q", call.query);
      url.searchParams.set("count", "10");
      const freshness = BRAVE_FRESHNESS[call.window];
      if (freshness) url.searchParams.set("freshness", freshness);
      const res = await callUpstream(settings, url, call, {
        headers: { Accept: "application/json", "X-Subscription-Token": settings.key ?? "" },
      });
      failForStatus(res, call.nowMs);
      // Brave leaves `web` out when it has no web results; present, it must hold a list.
      const body = requireRecord(await readJson(res));
      const results = optionalArray(optionalRecord(body["web"])["results"]);
      return {
        items: results.map((raw) => {
          const r = asRecord(raw) ?? {};
          const pageAge = asString(r["page_age"]);
          return {
            title: asString(r["title"]),
            url: asString(r["url"]),
            snippet: asString(r["description"]),
            publishedAt: pageAge === "" ? null : pageAge,
          };
        }),
      };
    },
  };
}
