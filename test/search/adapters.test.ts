import { describe, expect, it } from "vitest";
import { createLogger } from "../../src/logger.js";
import { normalizeItems } from "../../src/search/merge.js";
import { createArxivSource } from "../../src/search/sources/arxiv.js";
import { createBraveSource } from "../../src/search/sources/brave.js";
import { createExaSource } from "../../src/search/sources/exa.js";
import { createGdeltSource } from "../../src/search/sources/gdelt.js";
import { createGitHubSource } from "../../src/search/sources/github.js";
import { createHackerNewsSource } from "../../src/search/sources/hackernews.js";
import { createStackOverflowSource } from "../../src/search/sources/stackoverflow.js";
import { SourceFailure } from "../../src/search/sources/source-failure.js";
import type { SearchSource, SourceAnswer, SourceSettings } from "../../src/search/sources/types.js";
import { createWikipediaSource } from "../../src/search/sources/wikipedia.js";
import type { SearchWindow } from "../../src/search/validate.js";
import {
  ARXIV_ERROR_FEED, BRAVE_KEY, EXA_KEY, GDELT_429, GDELT_HTML_ERROR, brave429, defaultHandler, githubBody,
  hackernewsBody, stackoverflowBody, stackoverflowThrottle, type FakeSourceId,
} from "../support/fake-search/providers.js";
import { useFakeSearch } from "../support/fake-search/per-file.js";

/**
 * Each adapter against a local server speaking its provider's protocol: the
 * exact request (path, auth placement, native window parameter, User-Agent)
 * and the mapping of realistic answers, traps included.
 */

// Off the whole second on purpose: date rules must not depend on a round clock.
const NOW = Date.parse("2026-11-23T06:00:00.437Z");
const USER_AGENT = "typesafe-search/1.0 (+ops@typesafe.test)";
const logger = createLogger("silent");
const shared = useFakeSearch(() => NOW);

type Factory = (settings: SourceSettings) => SearchSource;
function source(id: FakeSourceId, factory: Factory, key?: string): SearchSource {
  return factory({ baseUrl: shared.current.providers[id].url, key, userAgent: USER_AGENT, logger });
}
function run(adapter: SearchSource, window: SearchWindow = "any", query = "rust async"): Promise<SourceAnswer> {
  return adapter.search({ query, window, nowMs: NOW, signal: AbortSignal.timeout(5_000) });
}
async function failure(promise: Promise<unknown>): Promise<SourceFailure> {
  const err = await promise.then(() => undefined, (e: unknown) => e);
  expect(err).toBeInstanceOf(SourceFailure);
  return err as SourceFailure;
}
function lastRequest(id: FakeSourceId) {
  const requests = shared.current.providers[id].requests;
  expect(requests).toHaveLength(1);
  return requests[0]!;
}

const CUTOFF_S = { "24h": Math.floor((NOW - 86_400_000) / 1000), "7d": Math.floor((NOW - 7 * 86_400_000) / 1000), "30d": Math.floor((NOW - 30 * 86_400_000) / 1000) };

describe("brave", () => {
  it.each([
    ["any", null],
    ["24h", "pd"],
    ["7d", "pw"],
    ["30d", "pm"],
  ] as const)("w=%s → freshness=%s, key in X-Subscription-Token", async (window, freshness) => {
    await run(source("brave", createBraveSource, BRAVE_KEY), window);
    const req = lastRequest("brave");
    expect(req.method).toBe("GET");
    expect(req.path).toBe("/res/v1/web/search");
    expect(req.query.get("q")).toBe("rust async");
    expect(req.query.get("count")).toBe("10");
    expect(req.query.get("freshness")).toBe(freshness);
    expect(req.headers["x-subscription-token"]).toBe(BRAVE_KEY);
    expect(req.headers["accept"]).toBe("application/json");
    expect(req.headers["user-agent"]).toBe(USER_AGENT);
    expect([...req.query.keys()].sort()).toEqual(freshness ? ["count", "freshness", "q"] : ["count", "q"]);
  });

  it("maps page_age (UTC without zone) and never parses the human `age`", async () => {
    const answer = await run(source("brave", createBraveSource, BRAVE_KEY));
    const items = normalizeItems(answer.items);
    expect(items.map((i) => [i.title, i.publishedAt])).toEqual([
      ["Asynchronous Programming in Rust & Tokio", "2026-11-23T04:00:00Z"],
      ["The Rust Async Book", null],
      ["Tokio - An asynchronous Rust runtime", "2026-11-03T06:00:00Z"],
    ]);
    expect(items[0]!.snippet).toBe("A guide to async Rust — futures, executors & more.");
  });

  it("429 RATE_LIMITED → rate_limited for the spent window's X-RateLimit-Reset (Brave sends no Retry-After), no upstream text", async () => {
    shared.current.providers.brave.reply(brave429(7));
    const err = await failure(run(source("brave", createBraveSource, BRAVE_KEY)));
    expect(err.kind).toBe("rate_limited");
    expect(err.opts.retryAfterMs).toBe(7_000);
    expect(err.reason).not.toContain("SECRET");
  });

  it("a refused key (422 SUBSCRIPTION_TOKEN_INVALID) → auth", async () => {
    const err = await failure(run(source("brave", createBraveSource, "wrong-key")));
    expect(err.kind).toBe("auth");
  });
});

describe("exa", () => {
  it.each([
    ["any", undefined],
    ["24h", "2026-11-22T06:00:00.437Z"],
    ["7d", "2026-11-16T06:00:00.437Z"],
    ["30d", "2026-10-24T06:00:00.437Z"],
  ] as const)("w=%s → startPublishedDate=%s, key in x-api-key", async (window, start) => {
    await run(source("exa", createExaSource, EXA_KEY), window);
    const req = lastRequest("exa");
    expect(req.method).toBe("POST");
    expect(req.path).toBe("/search");
    expect(req.headers["x-api-key"]).toBe(EXA_KEY);
    expect(req.headers["content-type"]).toBe("application/json");
    expect(req.headers["user-agent"]).toBe(USER_AGENT);
    expect(JSON.parse(req.body)).toEqual({
      query: "rust async",
      type: "auto",
      numResults: 10,
      contents: { highlights: { maxCharacters: 400 } },
      ...(start ? { startPublishedDate: start } : {}),
    });
  });

  it("maps highlights to the snippet and publishedDate to published_at", async () => {
    const items = normalizeItems((await run(source("exa", createExaSource, EXA_KEY))).items);
    expect(items[0]).toMatchObject({ url: "http://example.com/guide/?ref=a&utm_medium=feed", publishedAt: "2026-11-23T03:00:00.437Z" });
    expect(items[1]!.keys[0]).toBe("doi:10.48550/arxiv.1706.03762");
  });
});

describe("wikipedia", () => {
  it("sends the documented list=search query with the identifying User-Agent", async () => {
    await run(source("wikipedia", createWikipediaSource));
    const req = lastRequest("wikipedia");
    expect(req.path).toBe("/w/api.php");
    expect(Object.fromEntries(req.query)).toEqual({
      action: "query", list: "search", srsearch: "rust async", srlimit: "10", srprop: "snippet|timestamp", format: "json", formatversion: "2",
    });
    expect(req.headers["user-agent"]).toBe(USER_AGENT);
  });

  it("strips search-match markup, decodes entities, drops redirects, links the article, no date", async () => {
    const items = normalizeItems((await run(source("wikipedia", createWikipediaSource))).items);
    expect(items.map((i) => [i.title, i.url, i.publishedAt])).toEqual([
      ["Rust (programming language)", "https://en.wikipedia.org/wiki/Rust_(programming_language)", null],
      ["Async/await", "https://en.wikipedia.org/wiki/Async/await", null],
    ]);
    expect(items[0]!.snippet).toBe('Rust is a general-purpose programming language emphasizing "performance", type safety, and concurrency.');
  });

  it("a MediaWiki ratelimited error → rate_limited", async () => {
    shared.current.providers.wikipedia.reply({ body: { error: { code: "ratelimited", info: "You've exceeded your rate limit." } } });
    expect((await failure(run(source("wikipedia", createWikipediaSource)))).kind).toBe("rate_limited");
  });
});

describe("hackernews", () => {
  it.each([
    ["any", null],
    ["24h", `created_at_i>${CUTOFF_S["24h"]}`],
    ["7d", `created_at_i>${CUTOFF_S["7d"]}`],
    ["30d", `created_at_i>${CUTOFF_S["30d"]}`],
  ] as const)("w=%s → numericFilters=%s on the relevance endpoint", async (window, filter) => {
    await run(source("hackernews", createHackerNewsSource), window);
    const req = lastRequest("hackernews");
    expect(req.path).toBe("/api/v1/search");
    expect(req.query.get("query")).toBe("rust async");
    expect(req.query.get("tags")).toBe("story");
    expect(req.query.get("hitsPerPage")).toBe("10");
    expect(req.query.get("numericFilters")).toBe(filter);
    expect(req.headers["user-agent"]).toBe(USER_AGENT);
  });

  it("links the article with the discussion beside it; an Ask HN hit (url: null) keeps the discussion as url", async () => {
    const items = normalizeItems((await run(source("hackernews", createHackerNewsSource))).items);
    expect(items.map((i) => [i.url, i.discussionUrl, i.publishedAt])).toEqual([
      ["https://bitbashing.io/async-rust.html", "https://news.ycombinator.com/item?id=38000001", "2026-11-23T01:00:00Z"],
      ["https://news.ycombinator.com/item?id=38000002", undefined, "2026-11-13T06:00:00Z"],
    ]);
    expect(items[0]).toMatchObject({ snippet: "420 points · 250 comments · by pg · bitbashing.io", generatedSnippet: true });
    expect(items[1]).toMatchObject({ snippet: "I keep hearing both sides/opinions.", generatedSnippet: false });
  });

  it("drops a hit without an objectID instead of inventing a link", async () => {
    shared.current.providers.hackernews.reply({
      body: hackernewsBody([{ objectID: "", title: "x", url: null, author: "a", points: 1, num_comments: 0, created_at_i: Math.floor(NOW / 1000) }]),
    });
    expect(normalizeItems((await run(source("hackernews", createHackerNewsSource))).items)).toEqual([]);
  });
});

describe("stackoverflow", () => {
  it.each([
    ["any", null],
    ["24h", String(CUTOFF_S["24h"])],
    ["7d", String(CUTOFF_S["7d"])],
    ["30d", String(CUTOFF_S["30d"])],
  ] as const)("w=%s → fromdate=%s", async (window, fromdate) => {
    await run(source("stackoverflow", createStackOverflowSource), window);
    const req = lastRequest("stackoverflow");
    expect(req.path).toBe("/2.3/search/advanced");
    expect(Object.fromEntries(req.query)).toEqual({
      q: "rust async", site: "stackoverflow", sort: "relevance", order: "desc", pagesize: "10", ...(fromdate ? { fromdate } : {}),
    });
    expect(req.headers["user-agent"]).toBe(USER_AGENT);
  });

  it("sends the optional app key as the `key` query parameter", async () => {
    await run(source("stackoverflow", createStackOverflowSource, "app-key-1"));
    expect(lastRequest("stackoverflow").query.get("key")).toBe("app-key-1");
  });

  it("decodes entity-encoded titles and builds the snippet from answered/score/tags", async () => {
    const items = normalizeItems((await run(source("stackoverflow", createStackOverflowSource))).items);
    expect(items[0]).toMatchObject({
      title: `How do I use "async fn" in a trait & why isn't it allowed?`,
      snippet: "answered · score 42 · 3 answers · tags: rust, async-await",
      publishedAt: "2026-11-17T06:00:00Z",
    });
  });

  it("honours `backoff`: the answer is kept and the source pauses for that long", async () => {
    shared.current.providers.stackoverflow.reply({ body: stackoverflowBody([], { backoff: 10 }) });
    const answer = await run(source("stackoverflow", createStackOverflowSource));
    expect(answer.pauseMs).toBe(10_000);
    expect(answer.note).toBe("upstream asked for a 10 s pause; source paused");
  });

  it("an exhausted daily quota pauses the source until midnight UTC", async () => {
    shared.current.providers.stackoverflow.reply({ body: stackoverflowBody([], { quota_remaining: 0 }) });
    expect((await run(source("stackoverflow", createStackOverflowSource))).pauseMs).toBe(18 * 3600_000 - 437);
  });

  it("the throttle error (HTTP 400, error_id 502) → rate_limited for the seconds it names", async () => {
    shared.current.providers.stackoverflow.reply(stackoverflowThrottle(77));
    const err = await failure(run(source("stackoverflow", createStackOverflowSource)));
    expect([err.kind, err.opts.retryAfterMs]).toEqual(["rate_limited", 77_000]);
  });
});

describe("github", () => {
  it.each([
    ["any", "rust async"],
    ["24h", "rust async pushed:>=2026-11-22T06:00:00Z"],
    ["7d", "rust async pushed:>=2026-11-16T06:00:00Z"],
    ["30d", "rust async pushed:>=2026-10-24T06:00:00Z"],
  ] as const)("w=%s → q=%s", async (window, q) => {
    await run(source("github", createGitHubSource), window);
    const req = lastRequest("github");
    expect(req.path).toBe("/search/repositories");
    expect(req.query.get("q")).toBe(q);
    expect(req.query.get("per_page")).toBe("10");
    expect(req.headers["accept"]).toBe("application/vnd.github+json");
    expect(req.headers["authorization"]).toBeUndefined();
    expect(req.headers["user-agent"]).toBe(USER_AGENT);
  });

  it("sends the optional token as a Bearer Authorization header", async () => {
    await run(source("github", createGitHubSource, "ghp_test"));
    expect(lastRequest("github").headers["authorization"]).toBe("Bearer ghp_test");
  });

  it("incomplete_results: ok with a fixed note; pushed_at is the date", async () => {
    const answer = await run(source("github", createGitHubSource));
    expect(answer.note).toBe("upstream search timed out; results may be incomplete");
    expect(normalizeItems(answer.items)[0]).toMatchObject({
      title: "tokio-rs/tokio",
      url: "https://github.com/tokio-rs/tokio",
      snippet: "A runtime for writing reliable asynchronous applications with Rust.",
      generatedSnippet: false,
      publishedAt: "2026-11-23T05:00:00Z",
    });
  });

  it("complete results carry no note", async () => {
    shared.current.providers.github.reply({ body: githubBody([], false) });
    expect((await run(source("github", createGitHubSource))).note).toBeUndefined();
  });

  it("a primary rate limit (403, x-ratelimit-remaining 0) → rate_limited until the reset", async () => {
    shared.current.providers.github.reply({
      status: 403,
      headers: { "x-ratelimit-remaining": "0", "x-ratelimit-reset": String(NOW / 1000 + 42) },
      body: { message: "API rate limit exceeded for 1.2.3.4." },
    });
    const err = await failure(run(source("github", createGitHubSource)));
    expect([err.kind, err.opts.retryAfterMs]).toEqual(["rate_limited", 42_000]);
  });
});

describe("arxiv", () => {
  it.each([
    ["any", "all:rust AND all:async"],
    ["24h", "all:rust AND all:async AND submittedDate:[202611220600 TO 202611230600]"],
    ["7d", "all:rust AND all:async AND submittedDate:[202611160600 TO 202611230600]"],
    ["30d", "all:rust AND all:async AND submittedDate:[202610240600 TO 202611230600]"],
  ] as const)("w=%s → search_query=%s", async (window, expression) => {
    await run(source("arxiv", createArxivSource), window);
    const req = lastRequest("arxiv");
    expect(req.path).toBe("/api/query");
    expect(Object.fromEntries(req.query)).toEqual({
      search_query: expression, start: "0", max_results: "10", sortBy: "relevance", sortOrder: "descending",
    });
    expect(req.headers["user-agent"]).toBe(USER_AGENT);
  });

  it("keeps query syntax out of the expression", async () => {
    await run(source("arxiv", createArxivSource), "any", 'ti:"attention" OR (x) AND');
    expect(lastRequest("arxiv").query.get("search_query")).toBe("all:tiattention AND all:x");
  });

  it("parses the Atom feed: versionless ids, DOI, first-version date, entities decoded once", async () => {
    const answer = await run(source("arxiv", createArxivSource));
    expect(answer.items.map((i) => [i.arxivId, i.doi])).toEqual([["1706.03762", "10.48550/arXiv.1706.03762"], ["2611.01234", undefined]]);
    const items = normalizeItems(answer.items);
    expect(items.map((i) => [i.title, i.url, i.publishedAt])).toEqual([
      ["Attention Is All You Need", "https://arxiv.org/abs/1706.03762", "2017-06-12T17:57:34Z"],
      ["Structured <Async> Effects in Rust", "https://arxiv.org/abs/2611.01234", "2026-11-21T06:00:00Z"],
    ]);
    expect(items[0]!.snippet).toBe("The dominant sequence transduction models are based on complex recurrent or convolutional neural networks & attention.");
    expect(items[0]!.keys).toEqual(["doi:10.48550/arxiv.1706.03762", "arxiv:1706.03762", "url:arxiv.org/abs/1706.03762"]);
  });

  it.each([
    ["an error feed with HTTP 200", { headers: { "content-type": "application/atom+xml" }, body: ARXIV_ERROR_FEED }],
    ["an error feed with HTTP 400", { status: 400, headers: { "content-type": "application/atom+xml" }, body: ARXIV_ERROR_FEED }],
  ])("%s → error caused by the query, no upstream text", async (_name, reply) => {
    shared.current.providers.arxiv.reply(reply);
    const err = await failure(run(source("arxiv", createArxivSource)));
    expect([err.kind, err.upstreamFault]).toEqual(["error", false]);
    expect(err.reason).not.toContain("SECRET");
  });

  it("503 under load → rate_limited with its Retry-After", async () => {
    shared.current.providers.arxiv.reply({ status: 503, headers: { "retry-after": "30" }, body: "Service Unavailable" });
    const err = await failure(run(source("arxiv", createArxivSource)));
    expect([err.kind, err.opts.retryAfterMs]).toEqual(["rate_limited", 30_000]);
  });
});

describe("gdelt", () => {
  it.each([
    ["any", null],
    ["24h", "24h"],
    ["7d", "7d"],
    ["30d", "30d"],
  ] as const)("w=%s → timespan=%s, relevance sort", async (window, timespan) => {
    await run(source("gdelt", createGdeltSource), window);
    const req = lastRequest("gdelt");
    expect(req.path).toBe("/api/v2/doc/doc");
    expect(Object.fromEntries(req.query)).toEqual({
      query: "rust async", mode: "ArtList", format: "json", maxrecords: "10", sort: "HybridRel", ...(timespan ? { timespan } : {}),
    });
    expect(req.headers["user-agent"]).toBe(USER_AGENT);
  });

  it("maps seendate and builds the snippet from domain · language · country", async () => {
    const items = normalizeItems((await run(source("gdelt", createGdeltSource))).items);
    expect(items[0]).toMatchObject({ publishedAt: "2026-11-23T02:00:00Z", snippet: "news.example.org · English · United States" });
  });

  it("HTTP 200 text/html (an invalid query) → error caused by the query, no upstream text", async () => {
    shared.current.providers.gdelt.reply(GDELT_HTML_ERROR);
    const err = await failure(run(source("gdelt", createGdeltSource)));
    expect([err.kind, err.upstreamFault, err.reason]).toEqual(["error", false, "upstream rejected the query"]);
  });

  it("429 load shedding → rate_limited for 6 s (5 s pacing still draws 429s)", async () => {
    shared.current.providers.gdelt.reply(GDELT_429);
    const err = await failure(run(source("gdelt", createGdeltSource)));
    expect([err.kind, err.opts.retryAfterMs]).toEqual(["rate_limited", 6_000]);
  });

  it("an empty object (GDELT's no-match answer) → no items", async () => {
    shared.current.providers.gdelt.reply({ body: {} });
    expect((await run(source("gdelt", createGdeltSource))).items).toEqual([]);
  });
});

describe("transport rules shared by every adapter", () => {
  it("a keyed call never follows a redirect (the key would travel to another host)", async () => {
    shared.current.providers.brave.reply({ status: 302, headers: { location: `${shared.current.providers.exa.url}/search` }, body: "" });
    const err = await failure(run(source("brave", createBraveSource, BRAVE_KEY)));
    expect(err.reason).toBe("upstream unreachable");
    expect(shared.current.providers.exa.requests).toHaveLength(0);
  });

  it("a keyless call follows a redirect", async () => {
    let redirected = false;
    shared.current.providers.gdelt.reply((req) => {
      if (redirected) return defaultHandler("gdelt", () => NOW)(req);
      redirected = true;
      return { status: 301, headers: { location: "/api/v2/doc/doc?query=x&mode=ArtList&format=json" }, body: "" };
    });
    expect((await run(source("gdelt", createGdeltSource))).items).toHaveLength(2);
  });

  it.each([
    ["declared", true],
    ["streamed", false],
  ])("an answer above 4 MB (%s) is refused without being buffered", async (_name, declared) => {
    const huge = "x".repeat(5 * 1024 * 1024);
    shared.current.providers.hackernews.reply({ headers: declared ? {} : { "transfer-encoding": "chunked" }, body: `{"hits":[],"pad":"${huge}"}` });
    const err = await failure(run(source("hackernews", createHackerNewsSource)));
    expect(err.reason).toBe("upstream answer too large");
  });
});
