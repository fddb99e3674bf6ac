import { callUpstream, endpoint, failForStatus } from "./call-upstream.js";
import { asNumber, asRecord, asString, isoFromUnixSeconds, requireArray, requireRecord } from "./json-fields.js";
import { readJson } from "./read-answer.js";
import type { SearchSource, SourceSettings } from "./types.js";
import { windowCutoffMs } from "./window.js";
import { PAGE_SIZE, type FilterPlan, type SearchFilters } from "../filters.js";

/**
 * Algolia's HN search has no domain, language, country or safe-search
 * parameter (hn.algolia.com/api): typesafe checks domains on each story's
 * link and asks for a larger page to fill its own after the check; Algolia
 * allows up to 1000 hits per page (hitsPerPage), free like any other.
 */
export const HN_FILTERED_PAGE = 50;

export function hackernewsPlan(filters: SearchFilters): FilterPlan {
  const domains = filters.include.length > 0 || filters.exclude.length > 0;
  return { applied: {}, ...(domains ? { fetchCount: HN_FILTERED_PAGE } : {}) };
}

/**
 * Hacker News through Algolia's relevance endpoint (/search, never
 * /search_by_date: chronological ranks would poison fusion). A story that
 * links an article gets the article as `url` (so it fuses with the same page
 * from Brave, Exa or GDELT) and the discussion as `discussionUrl`; Ask/Show HN
 * stories have `url: null` and keep the discussion as `url`. `story_text` is
 * the author's own text, a real description; without it the snippet is facts.
 */
export function createHackerNewsSource(settings: SourceSettings): SearchSource {
  return {
    id: "hackernews",
    version: 2,
    planFilters: hackernewsPlan,
    async search(call) {
      const url = endpoint(settings.baseUrl, "/api/v1/search");
      url.searchParams.set("query", call.query);
      url.searchParams.set("tags", "story");
      url.searchParams.set("hitsPerPage", String(call.plan?.fetchCount ?? PAGE_SIZE));
      const cutoff = windowCutoffMs(call.window, call.nowMs);
      if (cutoff !== undefined) url.searchParams.set("numericFilters", `created_at_i>${Math.floor(cutoff / 1000)}`);
      const res = await callUpstream(settings, url, call, { headers: { Accept: "application/json" } });
      failForStatus(res, call.nowMs);
      const body = requireRecord(await readJson(res));
      return {
        items: requireArray(body["hits"]).map((raw) => {
          const h = asRecord(raw) ?? {};
          const id = asString(h["objectID"]);
          const given = asString(h["url"]);
          // An article link we could not show (not http(s)) must not cost the hit: the discussion stands in.
          const article = hostOf(given) !== "" && /^https?:\/\//i.test(given) ? given : "";
          const facts = [
            `${asNumber(h["points"]) ?? 0} points`,
            `${asNumber(h["num_comments"]) ?? 0} comments`,
            asString(h["author"]) ? `by ${asString(h["author"])}` : "",
            hostOf(article),
          ].filter((f) => f !== "");
          const text = asString(h["story_text"]);
          const discussion = /^\d+$/.test(id) ? `https://news.ycombinator.com/item?id=${id}` : "";
          const linked = article !== "" && discussion !== "";
          return {
            title: asString(h["title"]),
            url: article !== "" ? article : discussion,
            discussionUrl: linked ? discussion : undefined,
            snippet: text !== "" ? text : facts.join(" · "),
            generatedSnippet: text === "",
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
