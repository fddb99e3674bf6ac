import { callUpstream, endpoint, failForStatus } from "./call-upstream.js";
import { asRecord, asString, optionalArray, requireRecord } from "./json-fields.js";
import { readText } from "./read-answer.js";
import { SourceFailure } from "./source-failure.js";
import type { SearchSource, SourceSettings } from "./types.js";
import type { SearchWindow } from "../validate.js";
import { PAGE_SIZE, type FilterPlan, type SearchFilters } from "../filters.js";
import { countryCodeOfName, countryName, languageCodeOfName, languageName, squashName } from "../codes.js";

export const GDELT_TIMESPAN: Record<SearchWindow, string | undefined> = { any: undefined, "24h": "24h", "7d": "7d", "30d": "30d" };
/**
 * GDELT asks for one request every 5 seconds and its 429 carries no
 * Retry-After; pacing at exactly that interval still draws 429s, so the pause
 * after a rate notice is a little longer, like the pacing.
 */
export const GDELT_PAUSE_MS = 6_000;
/** GDELT rejects every keyword shorter than this. */
export const GDELT_MIN_KEYWORD = 3;
/** GDELT's rate notice, sent as a 429 or as HTTP 200 plain text. */
const RATE_NOTICE = /limit requests to one every/i;

/**
 * GDELT DOC 2.0 article list, sorted by HybridRel so ranks mean relevance
 * (the default is newest first). Invalid queries ("phrase too short") come
 * back as HTTP 200 text/html: that is an error caused by the query, not by
 * GDELT's health. There is no snippet; domain · language · country stands in.
 */
export function createGdeltSource(settings: SourceSettings): SearchSource {
  return {
    id: "gdelt",
    version: 2,
    prepare(query) {
      const kept = gdeltQuery(query);
      return kept === "" ? { skip: `every keyword is shorter than ${GDELT_MIN_KEYWORD} characters, which GDELT rejects` } : { query: kept };
    },
    planFilters: gdeltPlan,
    filterParameters: {
      d: "`domain:` in `query` (ORed; a substring match, so post-filtered too)",
      xd: "`-domain:` in `query` (a `*.` entry: post-filter)",
      l: "`sourcelang:<english name>`",
      c: "`sourcecountry:<english name>`",
    },
    async search(call) {
      const url = endpoint(settings.baseUrl, "/api/v2/doc/doc");
      const operators = call.filters ? gdeltOperators(call.filters) : [];
      url.searchParams.set("query", [gdeltQuery(call.query), ...operators].join(" "));
      url.searchParams.set("mode", "ArtList");
      url.searchParams.set("format", "json");
      url.searchParams.set("maxrecords", String(call.plan?.fetchCount ?? PAGE_SIZE));
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
      if (RATE_NOTICE.test(text.slice(0, 300))) {
        throw new SourceFailure("rate_limited", "upstream rate limit reached", { retryAfterMs: GDELT_PAUSE_MS });
      }
      if (/text\/html/i.test(type) || !/^\s*\{/.test(text)) {
        throw new SourceFailure("error", "upstream rejected the query", { upstreamFault: false });
      }
      const parsed = parseGdeltJson(text);
      // No match is `{}`: `articles` is left out, never null.
      const articles = optionalArray(requireRecord(parsed)["articles"]);
      return {
        items: articles.map((raw) => {
          const a = asRecord(raw) ?? {};
          return {
            title: asString(a["title"]),
            url: asString(a["url"]),
            snippet: [a["domain"], a["language"], a["sourcecountry"]].map(asString).filter((f) => f !== "").join(" · "),
            generatedSnippet: true,
            publishedAt: gdeltDate(asString(a["seendate"])),
            // GDELT states each article's language and source country by English name ("Spanish", "United Kingdom").
            language: languageCodeOfName(asString(a["language"])),
            country: countryCodeOfName(asString(a["sourcecountry"])),
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

/**
 * The query without keywords GDELT would reject (shorter than 3 characters,
 * e.g. "AI" in "AI regulation"): dropping them locally keeps the rest of the
 * search instead of a certain rejection. Quoted phrases and operators stay.
 */
export function gdeltQuery(query: string): string {
  const parts = query.match(/"[^"]*"|\S+/g) ?? [];
  return parts
    .filter((part) => part.startsWith('"') || /[:()]/.test(part) || /^(OR|AND)$/.test(part) || [...part.replace(/[^\p{L}\p{N}]/gu, "")].length >= GDELT_MIN_KEYWORD)
    .join(" ")
    .replace(/^(\s*(OR|AND)\s+)+|(\s+(OR|AND)\s*)+$/g, "");
}

/**
 * JSON.parse, repairing invalid escapes GDELT puts in titles (e.g. `\\'`),
 * as gdelt-doc-api's helpers.load_json does: the stray backslash goes. Still
 * unreadable → an error for this source only.
 */
export function parseGdeltJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    const repaired = text.replace(/\\(["\\/bfnrt]|u[0-9a-fA-F]{4})|\\/g, (whole: string, valid: string | undefined) => (valid ? whole : ""));
    try {
      return JSON.parse(repaired);
    } catch (err) {
      throw new SourceFailure("error", "upstream sent unreadable JSON", { cause: err });
    }
  }
}

/** GDELT's largest ArtList page (maxrecords up to 250); every call is free. */
export const GDELT_FILTERED_PAGE = 30;

/**
 * The filters as GDELT DOC 2.0 operators, appended to the query: `domain:`
 * for each domain to keep (ORed in parentheses when several), `-domain:` for
 * each to drop, `sourcelang:` and `sourcecountry:` with the English name
 * without spaces ("sourcecountry:unitedkingdom"), as the DOC 2.0 API's
 * announcement documents. `domain:` is a substring match (gdelt-doc-api
 * filters.py: "cnn.com" also matches "notactuallycnn.com"), so typesafe's
 * check drops what leaks, and a larger page keeps the page full. GDELT has
 * no safe search.
 */
export function gdeltOperators(filters: SearchFilters): string[] {
  const operators: string[] = [];
  const keep = [...new Set(filters.include.map((r) => `domain:${r.host}`))];
  if (keep.length === 1) operators.push(keep[0]!);
  else if (keep.length > 1) operators.push(`(${keep.join(" OR ")})`);
  for (const rule of filters.exclude) if (!rule.subdomainsOnly) operators.push(`-domain:${rule.host}`);
  if (filters.language !== undefined) operators.push(`sourcelang:${squashName(languageName(filters.language))}`);
  if (filters.country !== undefined) operators.push(`sourcecountry:${squashName(countryName(filters.country))}`);
  return operators;
}

export function gdeltPlan(filters: SearchFilters): FilterPlan {
  const domains = filters.include.length > 0 || filters.exclude.length > 0;
  return {
    applied: {
      d: "native",
      xd: filters.exclude.every((r) => !r.subdomainsOnly) ? "native" : "post_filtered",
      l: "native",
      c: "native",
      safe: "unsupported",
    },
    ...(domains ? { fetchCount: GDELT_FILTERED_PAGE } : {}),
  };
}
