import { callUpstream, endpoint, failForStatus } from "./call-upstream.js";
import { asRecord, asString, optionalArray, optionalRecord, requireRecord } from "./json-fields.js";
import { readJson } from "./read-answer.js";
import { clampPauseMs, retryAfterMs } from "./retry-after.js";
import { SourceFailure } from "./source-failure.js";
import type { SearchSource, SourceSettings } from "./types.js";
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
      if (res.status === 422 || res.status === 429 || res.status === 401 || res.status === 403) throw braveFailure(res, await readJson(res).catch(() => undefined), call.nowMs);
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
