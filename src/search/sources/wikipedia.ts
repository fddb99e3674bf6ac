import {
  asArray, asRecord, asString, callUpstream, endpoint, failForStatus, readJson, SourceFailure,
  type SearchSource, type SourceSettings,
} from "./types.js";

/** Articles are linked on the public site even when the API is reached through a mirror or proxy. */
export const WIKIPEDIA_ARTICLE_BASE = "https://en.wikipedia.org/wiki/";

/**
 * MediaWiki search. It has no publication date (`timestamp` is the last
 * edit), so the engine never queries it under a time window and published_at
 * stays null. Redirect stubs are dropped.
 */
export function createWikipediaSource(settings: SourceSettings): SearchSource {
  return {
    id: "wikipedia",
    version: 1,
    async search(call) {
      const url = endpoint(settings.baseUrl, "/w/api.php");
      url.searchParams.set("action", "query");
      url.searchParams.set("list", "search");
      url.searchParams.set("srsearch", call.query);
      url.searchParams.set("srlimit", "10");
      url.searchParams.set("srprop", "snippet|timestamp");
      url.searchParams.set("format", "json");
      url.searchParams.set("formatversion", "2");
      const res = await callUpstream(settings, url, call, { headers: { Accept: "application/json" } });
      failForStatus(res, call.nowMs);
      const body = asRecord(await readJson(res));
      const error = asRecord(body?.["error"]);
      if (error) {
        const code = asString(error["code"]);
        if (code === "ratelimited" || code === "maxlag") throw new SourceFailure("rate_limited", "upstream rate limit reached");
        throw new SourceFailure("error", "upstream rejected the search", { upstreamFault: false });
      }
      const hits = asArray(asRecord(body?.["query"])?.["search"]);
      return {
        items: hits
          .map((raw) => asRecord(raw) ?? {})
          .filter((h) => !/^\s*#REDIRECT/i.test(asString(h["snippet"])))
          .map((h) => {
            const title = asString(h["title"]);
            return {
              title,
              url: title === "" ? "" : WIKIPEDIA_ARTICLE_BASE + articlePath(title),
              snippet: asString(h["snippet"]),
              publishedAt: null,
            };
          }),
      };
    },
  };
}

/** Wikipedia's own form of an article path: spaces as "_", "/" and ":" left readable. */
export function articlePath(title: string): string {
  return encodeURIComponent(title.replace(/ /g, "_")).replace(/%2F/g, "/").replace(/%3A/g, ":");
}
