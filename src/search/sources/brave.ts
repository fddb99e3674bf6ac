import { callUpstream, endpoint, failForStatus } from "./call-upstream.js";
import { asRecord, asString, optionalArray, optionalRecord, requireRecord } from "./json-fields.js";
import { readJson } from "./read-answer.js";
import { clampPauseMs, retryAfterMs } from "./retry-after.js";
import { SourceFailure } from "./source-failure.js";
import type { SearchSource, SourceSettings } from "./types.js";
import type { SearchWindow } from "../validate.js";
import { PAGE_SIZE, type FilterPlan, type SearchFilters } from "../filters.js";
import type { DomainRule } from "../domains.js";

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
    filterParameters: {
      d: "`site:<domain>` in `q` (one domain; several: post-filter)",
      xd: "`-site:<domain>` in `q` for each (past 400 characters or 50 words, or a `*.` entry: post-filter)",
      l: "`search_lang` (the 49 languages Brave has a value for; others: post-filter on each result's `language`)",
      c: "`country` (Brave's 36 countries; others: unsupported)",
      safe: "`safesearch`",
    },
    planFilters(filters, query) {
      return bravePlan(filters, query);
    },
    async search(call) {
      const url = endpoint(settings.baseUrl, "/res/v1/web/search");
      const filters = call.filters;
      const native = filters ? braveNative(call.query, filters) : undefined;
      url.searchParams.set("q", native?.q ?? call.query);
      url.searchParams.set("count", String(call.plan?.fetchCount ?? PAGE_SIZE));
      const freshness = BRAVE_FRESHNESS[call.window];
      if (freshness) url.searchParams.set("freshness", freshness);
      if (native?.searchLang) url.searchParams.set("search_lang", native.searchLang);
      if (native?.country) url.searchParams.set("country", native.country);
      if (filters?.safe) url.searchParams.set("safesearch", filters.safe);
      const res = await callUpstream(settings, url, call, {
        headers: { Accept: "application/json", "X-Subscription-Token": settings.key ?? "" },
      });
      if (res.status === 422 || res.status === 429 || res.status === 401 || res.status === 403) throw braveFailure(res, await readJson(res).catch(() => undefined), call.nowMs);
      failForStatus(res, call.nowMs);
      // Brave leaves `web` out when it has no web results; present, it must hold a list.
      const body = requireRecord(await readJson(res));
      const results = optionalArray(optionalRecord(body["web"])["results"]);
      return {
        items: results.map((raw) => {
          const r = asRecord(raw) ?? {};
          const pageAge = asString(r["page_age"]);
          // Brave states each result's language ("en", "pt-br"): the filters' check reads its first part.
          const language = /^([a-z]{2})(-|$)/.exec(asString(r["language"]))?.[1];
          return {
            title: asString(r["title"]),
            url: asString(r["url"]),
            snippet: asString(r["description"]),
            publishedAt: pageAge === "" ? null : pageAge,
            language,
          };
        }),
      };
    },
  };
}

/**
 * Brave's error answers (api-dashboard.search.brave.com, "Response codes"):
 * a bad key is 422 SUBSCRIPTION_TOKEN_INVALID; any other 422 is the request's
 * own fault (VALIDATION, e.g. a query over 50 words); 429 is RATE_LIMITED
 * (per-second) or QUOTA_LIMITED (the plan's monthly quota). Brave sends no
 * Retry-After: the wait is its X-RateLimit-Reset, one value per policy window.
 */
function braveFailure(res: Response, body: unknown, nowMs: number): SourceFailure {
  const code = asString(asRecord(asRecord(body)?.["error"])?.["code"]);
  if (code === "SUBSCRIPTION_TOKEN_INVALID" || res.status === 401 || res.status === 403) {
    return new SourceFailure("auth", "upstream refused the subscription token; check TYPESAFE_SEARCH_BRAVE_KEY");
  }
  if (res.status === 422) return new SourceFailure("error", "upstream rejected the query (over 400 characters or 50 words?)", { upstreamFault: false });
  const resets = braveResets(res.headers);
  if (code === "QUOTA_LIMITED") {
    return new SourceFailure("quota", "the plan's monthly quota is used up; raise it on the Brave dashboard", {
      retryAfterMs: resets.length > 0 ? clampPauseMs(Math.max(...resets) * 1000) : undefined,
    });
  }
  return new SourceFailure("rate_limited", "upstream rate limit reached", {
    retryAfterMs: retryAfterMs(res.headers, nowMs) ?? braveRateWaitMs(res.headers),
  });
}

/** X-RateLimit-Reset, e.g. "1, 1419704": seconds until each policy window resets. */
function braveResets(headers: Headers): number[] {
  return (headers.get("x-ratelimit-reset") ?? "").split(",").filter((v) => v.trim() !== "").map(Number).filter((n) => Number.isFinite(n) && n >= 0);
}

/** The reset of every window whose X-RateLimit-Remaining is 0, the first window when none says so. */
export function braveRateWaitMs(headers: Headers): number | undefined {
  const resets = braveResets(headers);
  const remaining = (headers.get("x-ratelimit-remaining") ?? "").split(",").map((v) => Number(v.trim()));
  const spent = resets.filter((_, i) => remaining[i] === 0);
  const chosen = spent.length > 0 ? Math.max(...spent) : resets[0];
  return chosen === undefined ? undefined : clampPauseMs(Math.max(1, chosen) * 1000);
}

/**
 * Brave's search_lang values (api-dashboard.search.brave.com, Web search
 * "Language codes"), by the ISO 639-1 code they serve: Brave writes Japanese
 * `jp`, and has only script or country forms for Chinese and Portuguese.
 */
export const BRAVE_SEARCH_LANG: Record<string, string> = {
  ar: "ar", eu: "eu", bn: "bn", bg: "bg", ca: "ca", zh: "zh-hans", hr: "hr", cs: "cs", da: "da", nl: "nl", en: "en",
  et: "et", fi: "fi", fr: "fr", gl: "gl", de: "de", el: "el", gu: "gu", he: "he", hi: "hi", hu: "hu", is: "is", it: "it",
  ja: "jp", kn: "kn", ko: "ko", lv: "lv", lt: "lt", ms: "ms", ml: "ml", mr: "mr", nb: "nb", no: "nb", pl: "pl", pt: "pt-br",
  pa: "pa", ro: "ro", ru: "ru", sr: "sr", sk: "sk", sl: "sl", es: "es", sv: "sv", ta: "ta", te: "te", th: "th", tr: "tr",
  uk: "uk", vi: "vi",
};

/** Brave's `country` values ("Country codes"), ISO 3166-1 alpha-2 with GB for the United Kingdom. */
export const BRAVE_COUNTRIES = new Set([
  "AR", "AU", "AT", "BE", "BR", "CA", "CL", "DK", "FI", "FR", "DE", "HK", "IN", "ID", "IT", "JP", "KR", "MY", "MX", "NL",
  "NZ", "NO", "CN", "PL", "PT", "PH", "RU", "SA", "ZA", "ES", "SE", "CH", "TW", "TR", "GB", "US",
]);

/** Brave's bounds on `q` (Query parameters): 400 characters and 50 words, operators included. */
export const BRAVE_MAX_QUERY_CHARS = 400;
export const BRAVE_MAX_QUERY_WORDS = 50;
/** Brave's largest `count`; a request costs the same whatever the count. */
export const BRAVE_MAX_COUNT = 20;

/**
 * The filters as Brave takes them. Domains go into the query as operators
 * (`site:` for the one domain to keep, `-site:` for each to drop); a list
 * Brave cannot express exactly (several domains to keep, a "*." entry to
 * drop) or that would push the query past 400 characters or 50 words is
 * left to typesafe's check. Language and country are Brave's own parameters
 * when it has the value; safe search always is.
 */
export function braveNative(query: string, filters: SearchFilters): { q: string; searchLang?: string; country?: string; siteInclude: boolean; siteExclude: boolean } {
  const include = filters.include.length === 1 ? [`site:${filters.include[0]!.host}`] : [];
  const exclude = filters.exclude.length > 0 && filters.exclude.every((r: DomainRule) => !r.subdomainsOnly) ? filters.exclude.map((r) => `-site:${r.host}`) : [];
  const fits = (parts: string[]) => {
    const q = [query, ...parts].join(" ");
    return [...q].length <= BRAVE_MAX_QUERY_CHARS && q.split(/\s+/).length <= BRAVE_MAX_QUERY_WORDS;
  };
  const siteInclude = include.length > 0 && fits(include);
  const siteExclude = exclude.length > 0 && fits([...(siteInclude ? include : []), ...exclude]);
  const parts = [...(siteInclude ? include : []), ...(siteExclude ? exclude : [])];
  return {
    q: [query, ...parts].join(" "),
    searchLang: filters.language !== undefined ? BRAVE_SEARCH_LANG[filters.language] : undefined,
    country: filters.country !== undefined && BRAVE_COUNTRIES.has(filters.country) ? filters.country : undefined,
    siteInclude,
    siteExclude,
  };
}

/** How Brave applies each filter for this query (the query decides whether the operators fit). */
export function bravePlan(filters: SearchFilters, query: string): FilterPlan {
  const native = braveNative(query, filters);
  return {
    applied: {
      d: native.siteInclude ? "native" : "post_filtered",
      xd: native.siteExclude ? "native" : "post_filtered",
      // Brave states each result's language, so typesafe checks it when search_lang has no value for it.
      l: native.searchLang !== undefined ? "native" : "post_filtered",
      c: native.country !== undefined ? "native" : "unsupported",
      safe: "native",
    },
    fetchCount: BRAVE_MAX_COUNT,
  };
}
