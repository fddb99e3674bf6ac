import { BRAVE_RATE_LIMITED, BRAVE_TOKEN_INVALID, braveRateHeaders } from "./recorded.js";
import { startFakeProvider, type FakeHandler, type FakeProvider, type FakeReply, type RecordedRequest } from "./server.js";

/**
 * Fakes of the eight search providers, speaking each one's real protocol:
 * the real path, auth placement and answer shapes (recorded from the
 * providers' documentation and public answers), including their traps.
 * Each default handler answers a fixed, realistic result list for any query;
 * tests replace it with `provider.reply(...)` to replay another answer.
 */

export type FakeSourceId = "brave" | "exa" | "wikipedia" | "hackernews" | "stackoverflow" | "github" | "arxiv" | "gdelt";
export const FAKE_SOURCE_IDS: FakeSourceId[] = ["brave", "exa", "wikipedia", "hackernews", "stackoverflow", "github", "arxiv", "gdelt"];

export const BRAVE_KEY = "brave-test-subscription-token";
export const EXA_KEY = "exa-test-api-key";
export const CONTACT = "ops@typesafe.test";

/** Seconds since the epoch, for fixture dates relative to the test's clock. */
const unix = (ms: number) => Math.floor(ms / 1000);
const isoNoMs = (ms: number) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, "Z");
const HOUR = 3600_000;
const DAY = 24 * HOUR;

// ---------------------------------------------------------------- brave
// Source: Brave Search API docs, "Web search → Response model" (web.results[]:
// title, url, description, page_age, age, extra_snippets; ErrorResponse for
// errors), brave/brave-search-skills skills/web-search/SKILL.md and
// searxng/searxng searx/engines/braveapi.py. Error answers: ./recorded.ts.

export interface BraveResult {
  title: string;
  url: string;
  description: string;
  page_age?: string;
  age?: string;
  /** The result's language as Brave states it ("en", "de", "pt-br"); braveBody defaults it to "en". */
  language?: string;
}

/** Host and its subdomains, as a web search's `site:` operator reads a domain. */
export function underDomain(host: string, domain: string): boolean {
  return host === domain || host.endsWith(`.${domain}`);
}

/**
 * Brave's handling of the filters, applied to a fixed result list: the
 * `site:` and `-site:` operators in `q` (Brave's "Search operators" page),
 * `search_lang` (results in that language: each result states its
 * `language`), `count` (at most 20, "the actual number delivered may be
 * less"). `country` and `safesearch` only weigh Brave's own ranking and
 * adult filtering, which a fixed list cannot show: they are recorded, not
 * applied. A `q` over 400 characters or 50 words is Brave's 422 VALIDATION.
 */
export function braveFiltered(results: BraveResult[], req: RecordedRequest): FakeReply | BraveResult[] {
  const q = req.query.get("q") ?? "";
  if ([...q].length > 400 || q.split(/\s+/).length > 50) {
    return { status: 422, body: { type: "ErrorResponse", error: { id: "e1", status: 422, code: "VALIDATION", detail: "Unable to validate request parameter(s)." } } };
  }
  const sites = [...q.matchAll(/(^|\s)site:(\S+)/g)].map((m) => m[2]!);
  const notSites = [...q.matchAll(/(^|\s)-site:(\S+)/g)].map((m) => m[2]!);
  const lang = req.query.get("search_lang");
  const count = Math.min(20, Number(req.query.get("count") ?? 20));
  return results
    .filter((r) => {
      const host = new URL(r.url).hostname;
      if (sites.length > 0 && !sites.some((d) => underDomain(host, d))) return false;
      if (notSites.some((d) => underDomain(host, d))) return false;
      return lang === null || (r.language ?? "en") === lang;
    })
    .slice(0, count);
}

/** GET /res/v1/web/search answer (web results only; other verticals omitted). */
export function braveBody(results: BraveResult[]): object {
  return {
    type: "search",
    query: { original: "q", show_strict_warning: false, is_navigational: false, more_results_available: true },
    mixed: { type: "mixed", main: results.map((_, index) => ({ type: "web", index, all: false })) },
    web: {
      type: "search",
      family_friendly: true,
      results: results.map((r) => ({
        type: "search_result",
        subtype: "generic",
        is_source_local: false,
        is_source_both: false,
        language: "en",
        family_friendly: true,
        profile: { name: new URL(r.url).hostname, url: r.url, long_name: new URL(r.url).hostname },
        meta_url: { scheme: "https", netloc: new URL(r.url).hostname, path: "› docs" },
        extra_snippets: ["An extra snippet that the adapter does not need."],
        ...r,
      })),
    },
  };
}

/**
 * Brave's per-second 429 (body recorded in egoist/chatwise-releases#1296,
 * headers per Brave's "Response headers" docs; Brave sends no Retry-After):
 * the second window resets in `resetSeconds`.
 */
export function brave429(resetSeconds: number): FakeReply {
  return { ...BRAVE_RATE_LIMITED, headers: { "content-type": "application/json", ...braveRateHeaders([0, 14990], [resetSeconds, 1419704]) } };
}

function braveDefault(nowMs: () => number): FakeHandler {
  return (req) => {
    if (req.path !== "/res/v1/web/search") return { status: 404, body: { type: "ErrorResponse", error: { status: 404, code: "NOT_FOUND" } } };
    if (req.headers["x-subscription-token"] !== BRAVE_KEY) {
      return BRAVE_TOKEN_INVALID;
    }
    const now = nowMs();
    const filtered = braveFiltered(braveDefaultResults(now), req);
    return Array.isArray(filtered) ? { body: braveBody(filtered) } : filtered;
  };
}

function braveDefaultResults(now: number): BraveResult[] {
  return [
        {
          title: "Asynchronous Programming in <strong>Rust</strong> &amp; Tokio",
          url: "https://www.example.com/guide?utm_source=brave&ref=a",
          description: "A guide to <strong>async</strong> Rust &mdash; futures, executors &amp; more.",
          page_age: new Date(now - 2 * HOUR).toISOString().slice(0, 19),
          age: "2 hours ago",
        },
        {
          title: "The Rust Async Book",
          url: "https://rust-lang.github.io/async-book/",
          description: "Official book on asynchronous programming in Rust.",
          age: "November 3, 2023",
        },
        {
          title: "Tokio - An asynchronous Rust runtime",
          url: "https://tokio.rs/",
          description: "Tokio is an event-driven, non-blocking I/O platform.",
          page_age: new Date(now - 20 * DAY).toISOString().slice(0, 19),
          age: "3 weeks ago",
        },
  ];
}

// ---------------------------------------------------------------- exa
// Source: exa.ai/docs/reference/search (results[]: title — null when the page
// has none —, url, publishedDate, author, highlights; costDollars.total) and
// exa.ai/docs/admin/error-codes for { requestId, error, tag }.

export interface ExaResult {
  /** Exa sends null for pages without a title. */
  title: string | null;
  url: string;
  publishedDate?: string | null;
  author?: string | null;
  highlights?: string[];
}

/** POST /search answer with highlights and the upstream cost. */
export function exaBody(results: ExaResult[]): object {
  return {
    requestId: "b5947044c4b78efa9552a7c89b306d95",
    resolvedSearchType: "neural",
    results: results.map((r, i) => ({ id: r.url, score: 0.9 - i * 0.05, highlightScores: (r.highlights ?? []).map(() => 0.4), ...r })),
    searchType: "auto",
    costDollars: { total: 0.007, search: { neural: 0.005 }, contents: { highlights: 0.002 } },
  };
}

/**
 * Exa's domain filters applied to a fixed list (exa.ai/docs/reference/search:
 * `includeDomains`, `excludeDomains`, `numResults`). Excluded domains come
 * back anyway, as users report (exa-labs/exa-js#23, "Domains in
 * excludeDomains are still included in results"); this fake leaks the way
 * that can be shown with a fixed list: an excluded domain's subdomains are
 * not excluded.
 */
export function exaFiltered(results: ExaResult[], req: RecordedRequest): ExaResult[] {
  const body = JSON.parse(req.body || "{}") as { includeDomains?: string[]; excludeDomains?: string[]; numResults?: number };
  return results
    .filter((r) => {
      const host = new URL(r.url).hostname;
      if (body.includeDomains && !body.includeDomains.some((d) => underDomain(host, d))) return false;
      return !(body.excludeDomains ?? []).some((d) => host === d || host === `www.${d}`);
    })
    .slice(0, body.numResults ?? 10);
}

function exaDefault(nowMs: () => number): FakeHandler {
  return (req) => {
    if (req.path !== "/search" || req.method !== "POST") return { status: 404, body: { error: "Not found" } };
    if (req.headers["x-api-key"] !== EXA_KEY) return { status: 401, body: { requestId: "x", error: "Invalid API key", tag: "INVALID_API_KEY" } };
    const now = nowMs();
    return {
      body: exaBody(exaFiltered([
        {
          title: "Asynchronous Programming in Rust & Tokio",
          url: "http://example.com/guide/?ref=a&utm_medium=feed",
          publishedDate: new Date(now - 3 * HOUR).toISOString(),
          author: "Jane Doe",
          highlights: ["Futures are lazy: nothing happens until they are polled by an executor, which is the longest snippet of all."],
        },
        {
          title: "Attention Is All You Need",
          url: "https://doi.org/10.48550/arXiv.1706.03762",
          publishedDate: "2017-06-12T00:00:00.000Z",
          highlights: ["The dominant sequence transduction models..."],
        },
      ], req)),
    };
  };
}

// ---------------------------------------------------------------- wikipedia
// Source: mediawiki.org/wiki/API:Search (list=search, formatversion=2:
// query.search[].title/snippet/timestamp, snippet HTML with
// <span class="searchmatch">) and searxng/searxng searx/engines/wikipedia.py.

/** action=query&list=search answer, formatversion=2. */
export function wikipediaBody(hits: { title: string; snippet: string; timestamp?: string }[]): object {
  return {
    batchcomplete: true,
    continue: { sroffset: hits.length, continue: "-||" },
    query: {
      searchinfo: { totalhits: 2310 },
      search: hits.map((h, i) => ({ ns: 0, pageid: 29414838 + i, size: 120_000, wordcount: 9000, timestamp: "2026-11-20T08:00:00Z", ...h })),
    },
  };
}

function wikipediaDefault(): FakeHandler {
  return (req) => {
    // A mirror may put the wiki's language in the path (TYPESAFE_SEARCH_WIKIPEDIA_URL=http://mirror/{lang}).
    if (!/^(\/[a-z]{2,3})?\/w\/api\.php$/.test(req.path)) return { status: 404, body: "<!DOCTYPE html><title>Not Found</title>", headers: { "content-type": "text/html" } };
    return {
      body: wikipediaBody([
        {
          title: "Rust (programming language)",
          snippet: '<span class="searchmatch">Rust</span> is a general-purpose programming language emphasizing &quot;performance&quot;, type safety, and concurrency.',
        },
        { title: "Async/await", snippet: "In computer programming, the <span class=\"searchmatch\">async</span>/await pattern is a syntactic feature" },
        { title: "Rust async", snippet: "#REDIRECT [[Async/await]]" },
      ]),
    };
  };
}

// ---------------------------------------------------------------- hackernews
// Source: hn.algolia.com/api ("Search": hits[].objectID, title, url — null for
// Ask/Show HN —, story_text as HTML, points, num_comments, created_at_i) and
// searxng/searxng searx/engines/hackernews.py.

export interface HnHit {
  objectID: string;
  title: string;
  url: string | null;
  author: string;
  points: number;
  num_comments: number;
  created_at_i: number;
  story_text?: string | null;
}

/** Algolia's page: `hitsPerPage` hits (hn.algolia.com/api; Algolia allows 1 to 1000). HN has no domain or language parameter. */
export function hackernewsPage(req: RecordedRequest, hits: HnHit[]): HnHit[] {
  return hits.slice(0, Math.min(1000, Number(req.query.get("hitsPerPage") ?? 20)));
}

/** /api/v1/search answer. */
export function hackernewsBody(hits: HnHit[]): object {
  return {
    hits: hits.map((h) => ({
      created_at: new Date(h.created_at_i * 1000).toISOString(),
      _tags: ["story", `author_${h.author}`, `story_${h.objectID}`],
      story_id: Number(h.objectID),
      story_text: null,
      _highlightResult: { title: { value: h.title, matchLevel: "full", matchedWords: ["rust"] } },
      ...h,
    })),
    nbHits: hits.length,
    page: 0,
    nbPages: 1,
    hitsPerPage: 10,
    exhaustiveNbHits: true,
    query: "q",
    params: "query=q&tags=story&hitsPerPage=10",
    processingTimeMS: 2,
  };
}

function hackernewsDefault(nowMs: () => number): FakeHandler {
  return (req) => {
    if (req.path !== "/api/v1/search") return { status: 404, body: { message: "Not Found", status: 404 } };
    const now = nowMs();
    return {
      body: hackernewsBody(hackernewsPage(req, [
        { objectID: "38000001", title: "Async Rust is a bad language", url: "https://bitbashing.io/async-rust.html", author: "pg", points: 420, num_comments: 250, created_at_i: unix(now - 5 * HOUR) },
        {
          objectID: "38000002",
          title: "Ask HN: Is async Rust worth it?",
          url: null,
          author: "dang",
          points: 88,
          num_comments: 140,
          created_at_i: unix(now - 10 * DAY),
          story_text: "I keep hearing <i>both</i> sides&#x2F;opinions.",
        },
      ])),
    };
  };
}

// ---------------------------------------------------------------- stackoverflow
// Source: api.stackexchange.com/docs/advanced-search and /docs/wrapper
// (items, has_more, quota_max, quota_remaining, backoff); throttle error per
// /docs/error-handling (error_id 502 throttle_violation); searxng/searxng
// searx/engines/stackexchange.py.

export interface SoQuestion {
  question_id: number;
  title: string;
  link: string;
  creation_date: number;
  score: number;
  tags: string[];
  is_answered: boolean;
  answer_count: number;
}

/** /2.3/search/advanced wrapper object; `backoff` only when Stack Exchange sends one. */
export function stackoverflowBody(items: SoQuestion[], extra: { backoff?: number; quota_remaining?: number } = {}): object {
  return {
    items: items.map((q) => ({
      owner: { account_id: 1, reputation: 1000, user_id: 1, user_type: "registered", display_name: "someone" },
      view_count: 1234,
      last_activity_date: q.creation_date + 100,
      content_license: "CC BY-SA 4.0",
      ...q,
    })),
    has_more: true,
    quota_max: 300,
    quota_remaining: extra.quota_remaining ?? 297,
    ...(extra.backoff !== undefined ? { backoff: extra.backoff } : {}),
  };
}

/** Some Stack Exchange sites (stackexchange.com/sites), by short name and by domain, to their domain. */
const STACK_EXCHANGE_SITES: Record<string, string> = Object.fromEntries(
  ["stackoverflow.com", "superuser.com", "serverfault.com", "askubuntu.com", "es.stackoverflow.com", "ru.stackoverflow.com", "pt.stackoverflow.com", "ja.stackoverflow.com", "unix.stackexchange.com"]
    .flatMap((domain) => [[domain, domain], [domain.replace(/\.com$/, ""), domain]]),
);

/** The throttle error: HTTP 400 with error_id 502. */
export function stackoverflowThrottle(seconds: number): FakeReply {
  return {
    status: 400,
    body: { error_id: 502, error_message: `too many requests from this IP, more requests available in ${seconds} seconds`, error_name: "throttle_violation" },
  };
}

function stackoverflowDefault(nowMs: () => number): FakeHandler {
  return (req) => {
    if (req.path !== "/2.3/search/advanced") return { status: 404, body: { error_id: 404, error_message: "no method found with this name", error_name: "no_method" } };
    const site = req.query.get("site");
    if (site === null) return { status: 400, body: { error_id: 400, error_message: "site is required", error_name: "bad_parameter" } };
    // The API takes a site's domain or short name (api.stackexchange.com/docs, "site"); an unknown one is a bad_parameter.
    const domain = STACK_EXCHANGE_SITES[site];
    if (domain === undefined) return { status: 400, body: { error_id: 400, error_message: `No site found for name \`${site}\``, error_name: "bad_parameter" } };
    const now = nowMs();
    return {
      body: stackoverflowBody([
        {
          question_id: 71001,
          title: "How do I use &quot;async fn&quot; in a trait &amp; why isn&#39;t it allowed?",
          link: `https://${domain}/questions/71001/how-do-i-use-async-fn-in-a-trait`,
          creation_date: unix(now - 6 * DAY),
          score: 42,
          tags: ["rust", "async-await"],
          is_answered: true,
          answer_count: 3,
        },
      ]),
    };
  };
}

// ---------------------------------------------------------------- github
// Source: docs.github.com/rest/search/search#search-repositories (total_count,
// incomplete_results, items[] with its example response); rate-limit headers
// per docs.github.com "Rate limits for the REST API".

export interface GhRepo {
  full_name: string;
  html_url: string;
  description: string | null;
  pushed_at: string;
  stargazers_count: number;
  language?: string | null;
}

/** /search/repositories answer. */
export function githubBody(items: GhRepo[], incomplete = false): object {
  return {
    total_count: items.length,
    incomplete_results: incomplete,
    items: items.map((r, i) => ({
      id: 1000 + i,
      node_id: "R_kgDO",
      name: r.full_name.split("/")[1],
      private: false,
      owner: { login: r.full_name.split("/")[0], type: "Organization" },
      created_at: "2016-08-25T00:00:00Z",
      updated_at: r.pushed_at,
      forks_count: 10,
      score: 1,
      ...r,
    })),
  };
}

function githubDefault(nowMs: () => number): FakeHandler {
  return (req) => {
    if (req.path !== "/search/repositories") return { status: 404, body: { message: "Not Found", documentation_url: "https://docs.github.com/rest" } };
    if (!req.headers["user-agent"]) return { status: 403, body: { message: "Request forbidden by administrative rules. Please make sure your request has a User-Agent header" } };
    const now = nowMs();
    return {
      headers: { "x-ratelimit-limit": "10", "x-ratelimit-remaining": "9", "x-ratelimit-reset": String(unix(now) + 60), "x-ratelimit-resource": "search" },
      body: githubBody(
        [{ full_name: "tokio-rs/tokio", html_url: "https://github.com/tokio-rs/tokio", description: "A runtime for writing reliable asynchronous applications with Rust.", pushed_at: isoNoMs(now - 1 * HOUR), stargazers_count: 27000, language: "Rust" }],
        true,
      ),
    };
  };
}

// ---------------------------------------------------------------- arxiv
// Source: the Atom answer and the error feed (entry id under /api/errors) of
// info.arxiv.org/help/api/user-manual.html, the format lukasschwab/arxiv.py parses.

export interface ArxivEntry {
  id: string;
  title: string;
  summary: string;
  published: string;
  doi?: string;
}

/** An Atom feed as export.arxiv.org/api/query sends it. */
export function arxivFeed(entries: ArxivEntry[]): string {
  const body = entries
    .map(
      (e) => `  <entry>
    <id>http://arxiv.org/abs/${e.id}</id>
    <updated>${e.published}</updated>
    <published>${e.published}</published>
    <title>${e.title}</title>
    <summary>${e.summary}</summary>
    <author>
      <name>A. Author</name>
    </author>${e.doi ? `\n    <arxiv:doi xmlns:arxiv="http://arxiv.org/schemas/atom">${e.doi}</arxiv:doi>\n    <link title="doi" href="http://dx.doi.org/${e.doi}" rel="related"/>` : ""}
    <link href="http://arxiv.org/abs/${e.id}" rel="alternate" type="text/html"/>
    <link title="pdf" href="http://arxiv.org/pdf/${e.id}" rel="related" type="application/pdf"/>
    <arxiv:primary_category xmlns:arxiv="http://arxiv.org/schemas/atom" term="cs.CL" scheme="http://arxiv.org/schemas/atom"/>
    <category term="cs.CL" scheme="http://arxiv.org/schemas/atom"/>
  </entry>`,
    )
    .join("\n");
  return `<?xml version="1.0" encoding="UTF-8"?>
<feed xmlns="http://www.w3.org/2005/Atom">
  <link href="http://arxiv.org/api/query?search_query%3Dall%3Aattention%26id_list%3D%26start%3D0%26max_results%3D10" rel="self" type="application/atom+xml"/>
  <title type="html">ArXiv Query: search_query=all:attention&amp;id_list=&amp;start=0&amp;max_results=10</title>
  <id>http://arxiv.org/api/cHxbiOdZaP56ODnBPIenZhzg5f8</id>
  <updated>2026-11-23T00:00:00-05:00</updated>
  <opensearch:totalResults xmlns:opensearch="http://a9.com/-/spec/opensearch/1.1/">${entries.length}</opensearch:totalResults>
  <opensearch:startIndex xmlns:opensearch="http://a9.com/-/spec/opensearch/1.1/">0</opensearch:startIndex>
  <opensearch:itemsPerPage xmlns:opensearch="http://a9.com/-/spec/opensearch/1.1/">10</opensearch:itemsPerPage>
${body}
</feed>
`;
}

/** arXiv's error feed: one entry whose id is under /api/errors. */
export const ARXIV_ERROR_FEED = `<?xml version="1.0" encoding="UTF-8"?>
<feed xmlns="http://www.w3.org/2005/Atom" xmlns:opensearch="http://a9.com/-/spec/opensearch/1.1/">
  <link xmlns="http://www.w3.org/2005/Atom" href="http://arxiv.org/api/query?search_query=&amp;id_list=&amp;start=0&amp;max_results=10" rel="self" type="application/atom+xml"/>
  <title xmlns="http://www.w3.org/2005/Atom">ArXiv Query: search_query=&amp;id_list=&amp;start=0&amp;max_results=10</title>
  <id xmlns="http://www.w3.org/2005/Atom">http://arxiv.org/api/ZkM2Rr3Yn5dsc5SN7fyPvpjU9oo</id>
  <updated xmlns="http://www.w3.org/2005/Atom">2026-11-23T00:00:00-05:00</updated>
  <opensearch:totalResults xmlns:opensearch="http://a9.com/-/spec/opensearch/1.1/">1</opensearch:totalResults>
  <opensearch:startIndex xmlns:opensearch="http://a9.com/-/spec/opensearch/1.1/">0</opensearch:startIndex>
  <opensearch:itemsPerPage xmlns:opensearch="http://a9.com/-/spec/opensearch/1.1/">1</opensearch:itemsPerPage>
  <entry xmlns="http://www.w3.org/2005/Atom">
    <id>http://arxiv.org/api/errors#incorrect_id_format_for_submittedDate</id>
    <title>Error</title>
    <summary>incorrect date format: SECRET-UPSTREAM-DETAIL</summary>
    <updated>2026-11-23T00:00:00-05:00</updated>
    <link href="http://arxiv.org/api/errors#incorrect_id_format_for_submittedDate" rel="alternate" type="text/html"/>
    <author>
      <name>arXiv api core</name>
    </author>
  </entry>
</feed>
`;

function arxivDefault(nowMs: () => number): FakeHandler {
  return (req) => {
    if (req.path !== "/api/query") return { status: 404, body: "Not Found" };
    const now = nowMs();
    return {
      headers: { "content-type": "application/atom+xml; charset=utf-8" },
      body: arxivFeed([
        {
          id: "1706.03762v7",
          title: "Attention Is All\n      You Need",
          summary: "  The dominant sequence transduction models are based on complex recurrent or\nconvolutional neural networks &amp; attention.  ",
          published: "2017-06-12T17:57:34Z",
          doi: "10.48550/arXiv.1706.03762",
        },
        {
          id: "2611.01234v1",
          title: "Structured &lt;Async&gt; Effects in Rust",
          summary: "We study async effects.",
          published: isoNoMs(now - 2 * DAY),
        },
      ]),
    };
  };
}

// ---------------------------------------------------------------- gdelt
// Source: blog.gdeltproject.org "GDELT DOC 2.0 API debuts" (ArtList JSON:
// articles[].url, title, seendate, domain, language, sourcecountry; `{}` when
// nothing matches), alex9smith/gdelt-doc-api api_client.py (invalid queries
// answer HTTP 200 text/html) and koala73/worldmonitor#5843 (the 429 text).

export interface GdeltArticle {
  url: string;
  title: string;
  seendate: string;
  domain: string;
  language?: string;
  sourcecountry?: string;
}

/** mode=ArtList&format=json answer. */
export function gdeltBody(articles: GdeltArticle[]): object {
  return { articles: articles.map((a) => ({ url_mobile: "", socialimage: "", language: "English", sourcecountry: "United States", ...a })) };
}

/** YYYYMMDDTHHMMSSZ, GDELT's seendate. */
export function gdeltSeen(ms: number): string {
  return new Date(ms).toISOString().replace(/[-:]/g, "").replace(/\.\d{3}Z$/, "Z");
}

/** GDELT's answer to an invalid query: HTTP 200, text/html. */
export const GDELT_HTML_ERROR: FakeReply = {
  status: 200,
  headers: { "content-type": "text/html; charset=utf-8" },
  body: "The specified phrase is too short. SECRET-UPSTREAM-DETAIL<br>",
};

/** GDELT's load-shedding answer. */
export const GDELT_429: FakeReply = {
  status: 429,
  headers: { "content-type": "text/plain" },
  body: "Please limit requests to one every 5 seconds or contact kalev.leetaru5@gmail.com for larger queries.",
};

/**
 * GDELT's operators applied to a fixed list (blog.gdeltproject.org "GDELT
 * DOC 2.0 API debuts": domain:, sourcelang:, sourcecountry:, a leading "-"
 * negates, OR inside parentheses; maxrecords up to 250). `domain:` is a
 * substring match (gdelt-doc-api filters.py: "cnn.com" also matches
 * "notactuallycnn.com"), which leaks as GDELT does.
 */
export function gdeltFiltered(articles: GdeltArticle[], req: RecordedRequest): GdeltArticle[] {
  const query = req.query.get("query") ?? "";
  const terms = [...query.matchAll(/(-?)(domain|sourcelang|sourcecountry):([^\s()]+)/g)].map((m) => ({ negated: m[1] === "-", op: m[2]!, value: m[3]!.toLowerCase() }));
  const squash = (text: string | undefined) => (text ?? "").toLowerCase().replace(/[^a-z]/g, "");
  const field = (a: GdeltArticle, op: string) => (op === "domain" ? a.domain : op === "sourcelang" ? squash(a.language ?? "English") : squash(a.sourcecountry ?? "United States"));
  const matches = (a: GdeltArticle, op: string, value: string) => (op === "domain" ? field(a, op).includes(value) : field(a, op) === value);
  return articles
    .filter((a) => {
      for (const op of ["domain", "sourcelang", "sourcecountry"]) {
        const wanted = terms.filter((t) => t.op === op && !t.negated);
        if (wanted.length > 0 && !wanted.some((t) => matches(a, op, t.value))) return false;
        if (terms.some((t) => t.op === op && t.negated && matches(a, op, t.value))) return false;
      }
      return true;
    })
    .slice(0, Math.min(250, Number(req.query.get("maxrecords") ?? 75)));
}

function gdeltDefault(nowMs: () => number): FakeHandler {
  return (req) => {
    if (req.path !== "/api/v2/doc/doc") return { status: 404, body: "Not Found" };
    const now = nowMs();
    return {
      headers: { "content-type": "application/json; charset=utf-8" },
      body: gdeltBody(gdeltFiltered([
        { url: "https://news.example.org/2026/11/rust-async-survey", title: "Rust survey: async is the top pain point", seendate: gdeltSeen(now - 4 * HOUR), domain: "news.example.org" },
        { url: "https://www.example.com/guide?ref=a", title: "Asynchronous Programming in Rust", seendate: gdeltSeen(now - 26 * HOUR), domain: "example.com" },
      ], req)),
    };
  };
}

// ---------------------------------------------------------------- all

const DEFAULTS: Record<FakeSourceId, (nowMs: () => number) => FakeHandler> = {
  brave: braveDefault,
  exa: exaDefault,
  wikipedia: wikipediaDefault,
  hackernews: hackernewsDefault,
  stackoverflow: stackoverflowDefault,
  github: githubDefault,
  arxiv: arxivDefault,
  gdelt: gdeltDefault,
};

/** The default handler of one fake, for tests that restore it after replaying a trap. */
export function defaultHandler(id: FakeSourceId, nowMs: () => number = Date.now): FakeHandler {
  return DEFAULTS[id](nowMs);
}

export interface FakeSearch {
  providers: Record<FakeSourceId, FakeProvider>;
  /** TYPESAFE_SEARCH_* variables pointing every source at its fake, keys set, budgets generous. */
  env: Record<string, string>;
  /** Every request the fakes received. */
  requests(): RecordedRequest[];
  /** Every fake back to its default handler on the fakes' clock, its recorded requests dropped: the state before each test. */
  reset(): void;
  close(): Promise<void>;
}

/** Starts all eight fakes on 127.0.0.1 (port 0 each). */
export async function startFakeSearch(opts: { now?: () => number; ids?: FakeSourceId[] } = {}): Promise<FakeSearch> {
  const now = opts.now ?? Date.now;
  const ids = opts.ids ?? FAKE_SOURCE_IDS;
  const started = await Promise.all(ids.map(async (id) => [id, await startFakeProvider(DEFAULTS[id](now))] as const));
  const providers = Object.fromEntries(started) as Record<FakeSourceId, FakeProvider>;
  const env: Record<string, string> = {
    TYPESAFE_SEARCH_SOURCES: ids.join(","),
    TYPESAFE_SEARCH_CONTACT: CONTACT,
    TYPESAFE_SEARCH_BRAVE_KEY: BRAVE_KEY,
    TYPESAFE_SEARCH_EXA_KEY: EXA_KEY,
  };
  for (const [id, provider] of started) {
    const upper = id.toUpperCase();
    env[`TYPESAFE_SEARCH_${upper}_URL`] = provider.url;
    env[`TYPESAFE_SEARCH_${upper}_RATE`] = "10000/1s";
    env[`TYPESAFE_SEARCH_${upper}_CONCURRENCY`] = "100";
  }
  return {
    providers,
    env,
    requests: () => started.flatMap(([, p]) => p.requests),
    reset: () => {
      for (const [id, provider] of started) {
        provider.requests.length = 0;
        provider.reply(DEFAULTS[id](now));
      }
    },
    close: async () => {
      await Promise.all(started.map(([, p]) => p.close()));
    },
  };
}
