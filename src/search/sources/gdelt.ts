import {
  asRecord, asString, callUpstream, endpoint, failForStatus, optionalArray, readText, requireRecord, SourceFailure,
  type SearchSource, type SourceSettings,
} from "./types.js";
import type { SearchWindow } from "../validate.js";

export const GDELT_TIMESPAN: Record<SearchWindow, string | undefined> = { any: undefined, "24h": "24h", "7d": "7d", "30d": "30d" };
/** GDELT asks for one request every 5 seconds; its 429 carries no Retry-After. */
const GDELT_PAUSE_MS = 5_000;

/**
 * GDELT DOC 2.0 article list, sorted by HybridRel so ranks mean relevance
 * (the default is newest first). Invalid queries ("phrase too short") come
 * back as HTTP 200 text/html: that is an error caused by the query, not by
 * GDELT's health. There is no snippet; domain · language · country stands in.
 */
export function createGdeltSource(settings: SourceSettings): SearchSource {
  return {
    id: "gdelt",
    version: 1,
    async search(call) {
      const url = endpoint(settings.baseUrl, "/api/v2/doc/doc");
      url.searchParams.set("query", call.query);
      url.searchParams.set("mode", "ArtList");
      url.searchParams.set("format", "json");
      url.searchParams.set("maxrecords", "10");
      url.searchParams.set("sort", "HybridRel");
      const timespan = GDELT_TIMESPAN[call.window];
      if (timespan) url.searchParams.set("timespan", timespan);
      const res = await callUpstream(settings, url, call, { headers: { Accept: "application/json" } });
      if (res.status === 429) {
        throw new SourceFailure("rate_limited", "upstream rate limit reached", { retryAfterMs: GDELT_PAUSE_MS });
      }
      failForStatus(res, call.nowMs);
      const type = res.headers.get("content-type") ?? "";
      const text = await readText(res);
      if (/text\/html/i.test(type) || !/^\s*\{/.test(text)) {
        throw new SourceFailure("error", "upstream rejected the query", { upstreamFault: false });
      }
      let parsed: unknown;
      try {
        parsed = JSON.parse(text);
      } catch (err) {
        throw new SourceFailure("error", "upstream sent unreadable JSON", { cause: err });
      }
      // No match is `{}`: `articles` is left out, never null.
      const articles = optionalArray(requireRecord(parsed)["articles"]);
      return {
        items: articles.map((raw) => {
          const a = asRecord(raw) ?? {};
          return {
            title: asString(a["title"]),
            url: asString(a["url"]),
            snippet: [a["domain"], a["language"], a["sourcecountry"]].map(asString).filter((f) => f !== "").join(" · "),
            publishedAt: gdeltDate(asString(a["seendate"])),
          };
        }),
      };
    },
  };
}

/** YYYYMMDDTHHMMSSZ → ISO-8601; null when malformed. */
export function gdeltDate(seen: string): string | null {
  const m = /^(\d{4})(\d\d)(\d\d)T(\d\d)(\d\d)(\d\d)Z$/.exec(seen);
  return m ? `${m[1]}-${m[2]}-${m[3]}T${m[4]}:${m[5]}:${m[6]}Z` : null;
}
