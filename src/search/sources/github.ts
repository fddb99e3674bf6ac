import { callUpstream, endpoint, failForStatus } from "./call-upstream.js";
import { asArray, asNumber, asRecord, asString, requireArray, requireRecord } from "./json-fields.js";
import { readJson } from "./read-answer.js";
import { clampPauseMs, retryAfterMs } from "./retry-after.js";
import { SourceFailure } from "./source-failure.js";
import type { SearchSource, SourceSettings } from "./types.js";
import { windowCutoffMs } from "./window.js";
import { siteDomainPlan, type FilterPlan, type SearchFilters } from "../filters.js";

/** Every result is a repository on github.com; GitHub states no language of prose, country or rating. */
export function githubPlan(filters: SearchFilters): FilterPlan {
  return siteDomainPlan("github.com", filters);
}

/**
 * GitHub repository search. Under a window the query gets a
 * `pushed:>=<cutoff>` qualifier, so published_at is `pushed_at`: the last
 * push, i.e. recent activity rather than creation. A primary rate limit is a
 * 403 or 429 with x-ratelimit-remaining 0 (wait until x-ratelimit-reset); a
 * secondary one is a 403 naming it, with Retry-After or, without one, at
 * least a minute and exponential back-off (GitHub's REST rate-limit docs). `incomplete_results` means GitHub's own
 * search timed out: the items are still good, so the answer is ok with a note.
 */
export function createGitHubSource(settings: SourceSettings): SearchSource {
  /** Consecutive secondary limits: each doubles the next pause (60 s, 120 s, … 16 min). */
  let secondaryStreak = 0;
  return {
    id: "github",
    version: 2,
    planFilters: githubPlan,
    filterParameters: { d: "its one site, `github.com`", xd: "its one site, `github.com`" },
    async search(call) {
      const url = endpoint(settings.baseUrl, "/search/repositories");
      const cutoff = windowCutoffMs(call.window, call.nowMs);
      const qualifier = cutoff === undefined ? "" : ` pushed:>=${githubInstant(cutoff)}`;
      url.searchParams.set("q", call.query + qualifier);
      url.searchParams.set("per_page", "10");
      const headers: Record<string, string> = {
        Accept: "application/vnd.github+json",
        "X-GitHub-Api-Version": "2022-11-28",
      };
      if (settings.key) headers["Authorization"] = `Bearer ${settings.key}`;
      const res = await callUpstream(settings, url, call, { headers });
      if (res.status === 403 || res.status === 429) {
        if (isRateLimited(res.headers)) {
          secondaryStreak = 0;
          throw new SourceFailure("rate_limited", "upstream rate limit reached", {
            retryAfterMs: retryAfterMs(res.headers, call.nowMs) ?? resetMs(res.headers, call.nowMs),
          });
        }
        const message = asString(asRecord(await readJson(res).catch(() => undefined))?.["message"]);
        if (/secondary rate limit/i.test(message) || res.status === 429) {
          // docs.github.com "Rate limits for the REST API": no retry-after and
          // remaining not 0 → wait at least a minute, then back off exponentially.
          const pauseMs = clampPauseMs(SECONDARY_MIN_MS * 2 ** Math.min(secondaryStreak, 4));
          secondaryStreak++;
          throw new SourceFailure("rate_limited", "upstream secondary rate limit reached", { retryAfterMs: pauseMs });
        }
        if (res.status === 403) throw new SourceFailure("auth", "upstream refused our token (HTTP 403); check TYPESAFE_SEARCH_GITHUB_KEY");
      }
      if (res.status === 422) throw new SourceFailure("error", "upstream rejected the search", { upstreamFault: false });
      failForStatus(res, call.nowMs);
      secondaryStreak = 0;
      const body = requireRecord(await readJson(res));
      const items = requireArray(body["items"]).map((raw) => {
        const r = asRecord(raw) ?? {};
        const facts = [`★ ${asNumber(r["stargazers_count"]) ?? 0}`, asString(r["language"])].filter((f) => f !== "");
        const description = asString(r["description"]);
        const pushed = asString(r["pushed_at"]);
        return {
          title: asString(r["full_name"]),
          url: asString(r["html_url"]),
          snippet: description === "" ? facts.join(" · ") : description,
          generatedSnippet: description === "",
          publishedAt: pushed === "" ? null : pushed,
        };
      });
      return body["incomplete_results"] === true ? { items, note: "upstream search timed out; results may be incomplete" } : { items };
    },
  };
}

/** First pause after a secondary rate limit: GitHub says wait at least one minute. */
export const SECONDARY_MIN_MS = 60_000;

/** `YYYY-MM-DDTHH:MM:SSZ`: GitHub's search date syntax has no fractional seconds. */
export function githubInstant(ms: number): string {
  return new Date(ms).toISOString().slice(0, 19) + "Z";
}

function isRateLimited(headers: Headers): boolean {
  return headers.get("x-ratelimit-remaining") === "0" || headers.has("retry-after");
}

function resetMs(headers: Headers, nowMs: number): number | undefined {
  const reset = Number(headers.get("x-ratelimit-reset"));
  return Number.isFinite(reset) && reset > 0 ? clampPauseMs(Math.max(1000, reset * 1000 - nowMs)) : undefined;
}
