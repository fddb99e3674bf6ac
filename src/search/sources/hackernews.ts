import {
  asNumber, asRecord, asString, callUpstream, endpoint, failForStatus, isoFromUnixSeconds, readJson, requireArray,
  requireRecord, windowCutoffMs, type SearchSource, type SourceSettings,
} from "./types.js";

/**
 * Hacker News through Algolia's relevance endpoint (/search, never
 * /search_by_date: chronological ranks would poison fusion). The result URL
 * is the discussion, which is what this source is for; Ask/Show HN stories
 * have `url: null` and still get one.
 */
export function createHackerNewsSource(settings: SourceSettings): SearchSource {
  return {
    id: "hackernews",
    version: 1,
    async search(call) {
      const url = endpoint(settings.baseUrl, "/api/v1/search");
      url.searchParams.set("query", call.query);
      url.searchParams.set("tags", "story");
      url.searchParams.set("hitsPerPage", "10");
      const cutoff = windowCutoffMs(call.window, call.nowMs);
      if (cutoff !== undefined) url.searchParams.set("numericFilters", `created_at_i>${Math.floor(cutoff / 1000)}`);
      const res = await callUpstream(settings, url, call, { headers: { Accept: "application/json" } });
      failForStatus(res, call.nowMs);
      const body = requireRecord(await readJson(res));
      return {
        items: requireArray(body["hits"]).map((raw) => {
          const h = asRecord(raw) ?? {};
          const id = asString(h["objectID"]);
          const article = asString(h["url"]);
          const facts = [
            `${asNumber(h["points"]) ?? 0} points`,
            `${asNumber(h["num_comments"]) ?? 0} comments`,
            asString(h["author"]) ? `by ${asString(h["author"])}` : "",
            hostOf(article),
          ].filter((f) => f !== "");
          const text = asString(h["story_text"]);
          return {
            title: asString(h["title"]),
            url: /^\d+$/.test(id) ? `https://news.ycombinator.com/item?id=${id}` : "",
            snippet: text !== "" ? `${facts.join(" · ")} — ${text}` : facts.join(" · "),
            publishedAt: isoFromUnixSeconds(h["created_at_i"]),
          };
        }),
      };
    },
  };
}

function hostOf(url: string): string {
  try {
    return url === "" ? "" : new URL(url).hostname.replace(/^www\./, "");
  } catch {
    return "";
  }
}
