import { callUpstream, endpoint, failForStatus } from "./call-upstream.js";
import { asRecord, asString, requireArray, requireRecord } from "./json-fields.js";
import { readJson } from "./read-answer.js";
import { SourceFailure } from "./source-failure.js";
import type { SearchSource, SourceSettings } from "./types.js";

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
    version: 2,
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
      if (res.status === 403) {
        // Wikimedia's robot policy blocks clients by User-Agent with a 403
        // ("Please set a user-agent and respect our robot policy https://w.wiki/4wJS").
        throw new SourceFailure("auth", "upstream blocked our User-Agent; set TYPESAFE_SEARCH_CONTACT to an e-mail address or URL");
      }
      failForStatus(res, call.nowMs);
      const body = requireRecord(await readJson(res));
      const error = asRecord(body["error"]);
      if (error) {
        const code = asString(error["code"]);
        if (code === "ratelimited" || code === "maxlag") throw new SourceFailure("rate_limited", "upstream rate limit reached");
        throw new SourceFailure("error", "upstream rejected the search", { upstreamFault: false });
      }
      const hits = requireArray(requireRecord(body["query"])["search"]);
      return {
        items: hits
          .map((raw) => asRecord(raw) ?? {})
          .filter((h) => !/^\s*#REDIRECT/i.test(asString(h["snippet"])))
          .map((h) => {
            const title = asString(h["title"]);
            return {
              title,
              url: title === "" || !isWellFormed(title) ? "" : WIKIPEDIA_ARTICLE_BASE + articlePath(title),
              snippet: asString(h["snippet"]),
              publishedAt: null,
            };
          }),
      };
    },
  };
}

/** False for text with a lone surrogate: no article has such a title, and encodeURIComponent throws on it. */
function isWellFormed(text: string): boolean {
  return !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(text);
}

/**
 * MediaWiki's own article path (wfUrlencode in includes/GlobalFunctions.php):
 * PHP urlencode, then `; @ $ ! * ( ) , / ~ :` put back literally. So `'` is
 * %27 and `,` stays: "Washington,_D.C.", as Brave and every wiki link show it.
 */
export function articlePath(title: string): string {
  return encodeURIComponent(title.replace(/ /g, "_"))
    .replace(/'/g, "%27")
    .replace(/%(3B|40|24|21|2A|28|29|2C|2F|7E|3A)/gi, (escape) => decodeURIComponent(escape));
}
