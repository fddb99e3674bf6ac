import { callUpstream, endpoint, failForStatus } from "./call-upstream.js";
import { asRecord, asString, requireArray, requireRecord } from "./json-fields.js";
import { readJson } from "./read-answer.js";
import { SourceFailure } from "./source-failure.js";
import type { SearchSource, SourceSettings } from "./types.js";
import { siteDomainPlan, type FilterPlan, type SearchFilters } from "../filters.js";

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
    planFilters: (filters) => wikipediaPlan(settings.baseUrl, filters),
    filterParameters: { d: "its one site, `<l>.wikipedia.org`", xd: "its one site, `<l>.wikipedia.org`", l: "the host: that language's wiki, `<l>.wikipedia.org`" },
    async search(call) {
      const lang = call.filters?.language ?? "en";
      const url = endpoint(wikipediaApiBase(settings.baseUrl, lang) ?? settings.baseUrl, "/w/api.php");
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
              url: title === "" || !isWellFormed(title) ? "" : articleBase(lang) + articlePath(title),
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

function articleBase(lang: string): string {
  return lang === "en" ? WIKIPEDIA_ARTICLE_BASE : `https://${lang}.wikipedia.org/wiki/`;
}

/**
 * The API of the Wikipedia in one language: each language is its own wiki
 * at its own subdomain (meta.wikimedia.org "List of Wikipedias"), so the
 * language filter is the choice of host. A base URL naming a
 * `<xx>.wikipedia.org` host gets its first label replaced; a mirror or proxy
 * may write `{lang}` where the code goes (http://mirror/{lang}); any other
 * base serves English only (undefined for other languages).
 */
export function wikipediaApiBase(baseUrl: string, lang: string): string | undefined {
  if (/\{lang\}|%7Blang%7D/i.test(baseUrl)) return baseUrl.replace(/\{lang\}|%7Blang%7D/gi, lang);
  const url = new URL(baseUrl);
  if (/^[a-z]{2,3}\.wikipedia\.org$/.test(url.hostname)) {
    url.hostname = url.hostname.replace(/^[a-z]+/, lang);
    return url.href.replace(/\/+$/, "");
  }
  return lang === "en" ? baseUrl : undefined;
}

/** Results live on <l>.wikipedia.org; the language is native when the base can reach that wiki, else nothing could match. */
export function wikipediaPlan(baseUrl: string, filters: SearchFilters): FilterPlan {
  const lang = filters.language ?? "en";
  const site = siteDomainPlan(`${lang}.wikipedia.org`, filters);
  const applied = { ...site.applied, l: "native" as const };
  if (wikipediaApiBase(baseUrl, lang) === undefined) {
    return { applied, cannotServe: { field: "l", reason: `the configured Wikipedia URL serves English only, not ${lang}` } };
  }
  return { applied, ...(site.cannotServe ? { cannotServe: site.cannotServe } : {}) };
}
