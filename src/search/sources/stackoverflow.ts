import { callUpstream, endpoint } from "./call-upstream.js";
import { asArray, asNumber, asRecord, asString, isoFromUnixSeconds, requireArray, requireRecord } from "./json-fields.js";
import { readJson } from "./read-answer.js";
import { clampPauseMs } from "./retry-after.js";
import { SourceFailure } from "./source-failure.js";
import type { SearchSource, SourceSettings } from "./types.js";
import { windowCutoffMs } from "./window.js";
import { hostAllowed, type FilterPlan, type SearchFilters } from "../filters.js";

const DEFAULT_THROTTLE_MS = 180_000;

/**
 * Stack Exchange API 2.3, Stack Overflow. Titles arrive HTML-entity encoded
 * (normalize decodes them); the default filter has no body, so the snippet is
 * built from answered state, score and tags. The API asks clients to honour
 * `backoff` and reports the daily `quota_remaining`; both become a pause of
 * the source. Its throttle error is HTTP 400 with error_id 502.
 */
export function createStackOverflowSource(settings: SourceSettings): SearchSource {
  return {
    id: "stackoverflow",
    version: 2,
    planFilters: stackExchangePlan,
    filterParameters: {
      d: "`site`: the first Stack Exchange site kept",
      xd: "`site`: never a dropped one",
      l: "`site`: `es.`, `ru.`, `pt.` or `ja.stackoverflow.com` (other languages: `filtered_out`)",
    },
    async search(call) {
      const url = endpoint(settings.baseUrl, "/2.3/search/advanced");
      url.searchParams.set("q", call.query);
      url.searchParams.set("site", call.filters ? (stackExchangeSite(call.filters) ?? "stackoverflow") : "stackoverflow");
      url.searchParams.set("sort", "relevance");
      url.searchParams.set("order", "desc");
      url.searchParams.set("pagesize", "10");
      const cutoff = windowCutoffMs(call.window, call.nowMs);
      if (cutoff !== undefined) url.searchParams.set("fromdate", String(Math.floor(cutoff / 1000)));
      if (settings.key) url.searchParams.set("key", settings.key);
      const res = await callUpstream(settings, url, call, { headers: { Accept: "application/json" } });
      if (res.status === 429) throw new SourceFailure("rate_limited", "upstream rate limit reached", { retryAfterMs: DEFAULT_THROTTLE_MS });
      const answer = await readJson(res);
      const errorId = asNumber(asRecord(answer)?.["error_id"]);
      if (!res.ok || errorId !== undefined) throw classifyError(res.status, errorId, asString(asRecord(answer)?.["error_message"]));
      const body = requireRecord(answer);
      const questions = requireArray(body["items"]);

      const pauses: number[] = [];
      const notes: string[] = [];
      const backoff = asNumber(body["backoff"]);
      if (backoff !== undefined && backoff > 0) {
        const pauseMs = clampPauseMs(backoff * 1000);
        pauses.push(pauseMs);
        notes.push(`upstream asked for a ${Math.ceil(pauseMs / 1000)} s pause; source paused`);
      }
      if (asNumber(body["quota_remaining"]) === 0) {
        pauses.push(msUntilNextUtcMidnight(call.nowMs));
        notes.push("upstream daily quota used up; source paused until 00:00 UTC");
      }
      return {
        items: questions.map((raw) => {
          const q = asRecord(raw) ?? {};
          const tags = asArray(q["tags"]).map(asString).filter((t) => t !== "");
          const answered = q["is_answered"] === true ? "answered" : "unanswered";
          const facts = [answered, `score ${asNumber(q["score"]) ?? 0}`, `${asNumber(q["answer_count"]) ?? 0} answers`];
          if (tags.length > 0) facts.push(`tags: ${tags.join(", ")}`);
          return {
            title: asString(q["title"]),
            url: asString(q["link"]),
            snippet: facts.join(" · "),
            generatedSnippet: true,
            publishedAt: isoFromUnixSeconds(q["creation_date"]),
          };
        }),
        ...(pauses.length > 0 ? { pauseMs: Math.max(...pauses), note: notes.join("; ") } : {}),
      };
    },
  };
}

function classifyError(status: number, errorId: number | undefined, message: string): SourceFailure {
  if (errorId === 502) {
    const seconds = /available in (\d+) seconds/.exec(message)?.[1];
    return new SourceFailure("rate_limited", "upstream rate limit reached", {
      retryAfterMs: seconds ? clampPauseMs(Number(seconds) * 1000) : DEFAULT_THROTTLE_MS,
    });
  }
  if (errorId === 401 || errorId === 402 || errorId === 403 || errorId === 405 || status === 401 || status === 403) {
    return new SourceFailure("auth", "upstream refused our credentials");
  }
  if (errorId === 400) return new SourceFailure("error", "upstream rejected the search", { upstreamFault: false });
  return new SourceFailure("error", `upstream answered HTTP ${status}`);
}

function msUntilNextUtcMidnight(nowMs: number): number {
  const d = new Date(nowMs);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate() + 1) - nowMs;
}

/**
 * Stack Exchange sites by language: Stack Overflow is English; its sister
 * sites in Spanish, Russian, Portuguese and Japanese live on their own hosts
 * (stackexchange.com/sites).
 */
export const STACK_OVERFLOW_BY_LANGUAGE: Record<string, string> = {
  en: "stackoverflow.com", es: "es.stackoverflow.com", ru: "ru.stackoverflow.com", pt: "pt.stackoverflow.com", ja: "ja.stackoverflow.com",
};

/** Hosts of Stack Exchange network sites besides *.stackexchange.com (stackexchange.com/sites). */
const NETWORK_HOSTS = new Set(["stackoverflow.com", "superuser.com", "serverfault.com", "askubuntu.com", "mathoverflow.net", "stackapps.com",
  ...Object.values(STACK_OVERFLOW_BY_LANGUAGE)]);

function isNetworkSite(host: string): boolean {
  return NETWORK_HOSTS.has(host) || /^[a-z0-9-]+\.stackexchange\.com$/.test(host);
}

/**
 * The one site to search: the API searches a single site per call, named by
 * `site` as its domain or short name (api.stackexchange.com/docs: "the full
 * domain name (ie. "stackoverflow.com"), or a short form"). With domains to
 * keep, the first kept network site; with a language, that language's Stack
 * Overflow; otherwise Stack Overflow. Undefined when the filters leave none.
 */
export function stackExchangeSite(filters: SearchFilters): string | undefined {
  const byLanguage = filters.language === undefined ? undefined : STACK_OVERFLOW_BY_LANGUAGE[filters.language];
  if (filters.language !== undefined && byLanguage === undefined) return undefined;
  const candidates = filters.include.length > 0 ? filters.include.filter((r) => !r.subdomainsOnly && isNetworkSite(r.host)).map((r) => r.host) : ["stackoverflow.com"];
  const site = (byLanguage ? [byLanguage] : candidates).find((host) => hostAllowed(host, filters));
  if (site === undefined) return undefined;
  return site === "stackoverflow.com" ? "stackoverflow" : site;
}

export function stackExchangePlan(filters: SearchFilters): FilterPlan {
  const applied = { d: "native", xd: "native", l: "native", c: "unsupported", safe: "unsupported" } as const;
  if (stackExchangeSite(filters) !== undefined) return { applied };
  const field = filters.language !== undefined && STACK_OVERFLOW_BY_LANGUAGE[filters.language] === undefined ? "l" : filters.include.length > 0 ? "d" : "xd";
  const reason = field === "l"
    ? `Stack Overflow has no site in language ${filters.language}`
    : "the domains leave no Stack Exchange site to search";
  return { applied, cannotServe: { field, reason } };
}
