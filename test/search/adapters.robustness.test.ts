import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { SearchRequestSchema } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { createLogger } from "../../src/logger.js";
import { createSearchEngine } from "../../src/search/engine.js";
import { cleanDate, normalizeItems } from "../../src/search/merge.js";
import { createArxivSource } from "../../src/search/sources/arxiv.js";
import { createBraveSource } from "../../src/search/sources/brave.js";
import { createExaSource } from "../../src/search/sources/exa.js";
import { createGdeltSource } from "../../src/search/sources/gdelt.js";
import { createGitHubSource } from "../../src/search/sources/github.js";
import { createHackerNewsSource } from "../../src/search/sources/hackernews.js";
import { createStackOverflowSource } from "../../src/search/sources/stackoverflow.js";
import { UNEXPECTED_SHAPE } from "../../src/search/sources/json-fields.js";
import { MAX_PAUSE_MS } from "../../src/search/sources/retry-after.js";
import { SourceFailure } from "../../src/search/sources/source-failure.js";
import type { SearchSource, SourceSettings } from "../../src/search/sources/types.js";
import { createWikipediaSource } from "../../src/search/sources/wikipedia.js";
import {
  BRAVE_KEY, EXA_KEY, arxivFeed, braveBody, exaBody, gdeltBody, gdeltSeen, githubBody, hackernewsBody, stackoverflowBody,
  wikipediaBody, type FakeSourceId,
} from "../support/fake-search/providers.js";
import { useFakeSearch } from "../support/fake-search/per-file.js";
import type { FakeReply } from "../support/fake-search/server.js";

/**
 * Odd provider data against every adapter, over real HTTP to the fakes: one
 * bad item never sinks the others, and an answer whose top-level shape is not
 * the provider's documented one is an error, never an empty (charged) answer.
 */

// Off the whole second on purpose: date rules must not depend on a round clock.
const NOW = Date.parse("2026-11-23T06:00:00.437Z");
const logger = createLogger("silent");
const shared = useFakeSearch(() => NOW);

const FACTORIES: Record<FakeSourceId, { create: (settings: SourceSettings) => SearchSource; key?: string }> = {
  brave: { create: createBraveSource, key: BRAVE_KEY },
  exa: { create: createExaSource, key: EXA_KEY },
  wikipedia: { create: createWikipediaSource },
  hackernews: { create: createHackerNewsSource },
  stackoverflow: { create: createStackOverflowSource },
  github: { create: createGitHubSource },
  arxiv: { create: createArxivSource },
  gdelt: { create: createGdeltSource },
};

function search(id: FakeSourceId, reply: FakeReply) {
  shared.current.providers[id].reply(reply);
  const { create: factory, key } = FACTORIES[id];
  const adapter = factory({ baseUrl: shared.current.providers[id].url, key, userAgent: "typesafe-test/1.0 (+ops@typesafe.test)", logger });
  return adapter.search({ query: "rust async", window: "any", nowMs: NOW, signal: AbortSignal.timeout(5_000) });
}

const json = (body: string): FakeReply => ({ headers: { "content-type": "application/json" }, body });
const atom = (body: string): FakeReply => ({ headers: { "content-type": "application/atom+xml" }, body });

describe("an answer whose top-level shape is wrong is an error, not an empty answer", () => {
  it.each([
    ["hackernews", '{"hits":null}'],
    ["hackernews", '{"hits":{}}'],
    ["hackernews", '{"nbHits":0}'],
    ["hackernews", "null"],
    ["hackernews", "[]"],
    ["brave", '{"type":"search","web":{"results":null}}'],
    ["brave", '{"type":"search","web":{"results":{}}}'],
    ["brave", '{"type":"search","web":"x"}'],
    ["brave", "[]"],
    ["exa", '{"results":null}'],
    ["exa", '{"requestId":"x"}'],
    ["exa", '"results"'],
    ["wikipedia", '{"batchcomplete":true,"query":{"search":null}}'],
    ["wikipedia", '{"batchcomplete":true}'],
    ["wikipedia", '{"query":[]}'],
    ["stackoverflow", '{"items":null,"quota_remaining":10}'],
    ["stackoverflow", '{"quota_remaining":10}'],
    ["stackoverflow", "null"],
    ["github", '{"total_count":0,"items":null}'],
    ["github", '{"total_count":0}'],
    ["github", "[]"],
    ["gdelt", '{"articles":null}'],
    ["gdelt", '{"articles":{}}'],
  ] as const)("%s answering %s", async (id, body) => {
    const err = await search(id, json(body)).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(SourceFailure);
    expect([(err as SourceFailure).kind, (err as SourceFailure).reason]).toEqual(["error", UNEXPECTED_SHAPE]);
  });

  it.each([
    ["brave without `web` (no web results)", "brave", '{"type":"search","query":{"original":"q"}}'],
    ["brave with `web` but no `results`", "brave", '{"type":"search","web":{"type":"search"}}'],
    ["gdelt's no-match `{}`", "gdelt", "{}"],
    ["hackernews with no hits", "hackernews", '{"hits":[],"nbHits":0}'],
  ] as const)("%s is a real empty answer", async (_name, id, body) => {
    expect((await search(id, json(body))).items).toEqual([]);
  });
});

describe("one bad item never sinks the others", () => {
  const good = { title: "Good item", url: "https://good.example/" };
  it.each<[string, FakeSourceId, FakeReply, Array<[string, string | null]>]>([
    [
      "hackernews: created_at_i out of Date's range, a null hit, a hit without title",
      "hackernews",
      json(JSON.stringify({
        hits: [
          { objectID: "1", title: "Far future", url: null, created_at_i: 1e20 },
          null,
          { objectID: "2", title: "Far past", url: null, created_at_i: -1e20 },
          { objectID: "3", title: null, url: null, created_at_i: Math.floor(NOW / 1000) },
          { objectID: "4", title: "Fine", url: "https://x.example/", created_at_i: Math.floor(NOW / 1000) },
          ...(hackernewsBody([]) as { hits: unknown[] }).hits,
        ],
      })),
      [["Far future", null], ["Far past", null], ["Fine", "2026-11-23T06:00:00Z"]],
    ],
    [
      "stackoverflow: creation_date out of range, a string item, no link",
      "stackoverflow",
      json(JSON.stringify({
        ...stackoverflowBody([]),
        items: [
          { title: "Far future", link: "https://stackoverflow.com/q/1", creation_date: 1e20 },
          "not a question",
          { title: "No link", creation_date: Math.floor(NOW / 1000) },
          { title: "Fine", link: "https://stackoverflow.com/q/2", creation_date: Math.floor(NOW / 1000) },
        ],
      })),
      [["Far future", null], ["Fine", "2026-11-23T06:00:00Z"]],
    ],
    [
      "brave: unreadable page_age, a javascript: URL, no title, a number as item",
      "brave",
      json(JSON.stringify({
        type: "search",
        web: {
          results: [
            { title: "Odd date", url: "https://a.example/", page_age: "yesterday-ish" },
            { title: "Script", url: "javascript:alert(1)" },
            { url: "https://no-title.example/", description: "no title" },
            42,
            { title: "Impossible day", url: "https://b.example/", page_age: "2026-02-30T00:00:00" },
            ...((braveBody([{ ...good, description: "", page_age: "2026-11-22T06:00:00" }]) as { web: { results: unknown[] } }).web.results),
          ],
        },
      })),
      [["Odd date", null], ["Impossible day", null], ["Good item", "2026-11-22T06:00:00Z"]],
    ],
    [
      "exa: a numeric publishedDate, a null url, non-list highlights",
      "exa",
      json(JSON.stringify({
        ...exaBody([]),
        results: [
          { title: "Numeric date", url: "https://a.example/", publishedDate: 12 },
          { title: "No url", url: null },
          { ...good, publishedDate: "2026-11-20T00:00:00.000Z", highlights: "x" },
        ],
      })),
      [["Numeric date", null], ["Good item", "2026-11-20T00:00:00Z"]],
    ],
    [
      "github: an impossible pushed_at, a null html_url",
      "github",
      json(JSON.stringify(githubBody([
        { full_name: "a/odd", html_url: "https://github.com/a/odd", description: null, pushed_at: "2026-13-45T99:00:00Z", stargazers_count: 1 },
        { full_name: "a/nourl", html_url: null as unknown as string, description: null, pushed_at: "2026-11-20T00:00:00Z", stargazers_count: 1 },
        { full_name: "a/good", html_url: "https://github.com/a/good", description: null, pushed_at: "2026-11-20T00:00:00Z", stargazers_count: 1 },
      ]))),
      [["a/odd", null], ["a/good", "2026-11-20T00:00:00Z"]],
    ],
    [
      "wikipedia: a title with a lone surrogate, a hit without title",
      "wikipedia",
      json(JSON.stringify(wikipediaBody([
        { title: "Broken \ud800 title", snippet: "x" },
        { title: undefined as unknown as string, snippet: "no title" },
        { title: "Rust", snippet: "fine" },
      ]))),
      [["Rust", null]],
    ],
    [
      "gdelt: an impossible seendate, an ftp URL",
      "gdelt",
      json(JSON.stringify(gdeltBody([
        { url: "https://a.example/x", title: "Odd date", seendate: "20261399T999999Z", domain: "a.example" },
        { url: "ftp://b.example/x", title: "Ftp", seendate: gdeltSeen(NOW), domain: "b.example" },
        { url: "https://c.example/x", title: "Fine", seendate: gdeltSeen(NOW), domain: "c.example" },
      ]))),
      [["Odd date", null], ["Fine", "2026-11-23T06:00:00Z"]],
    ],
    [
      "arxiv: an unreadable published date, an entry without title",
      "arxiv",
      atom(arxivFeed([
        { id: "2611.00001v1", title: "Odd date", summary: "s", published: "sometime" },
        { id: "2611.00002v1", title: "", summary: "no title", published: "2026-11-20T00:00:00Z" },
        { id: "2611.00003v1", title: "Fine", summary: "s", published: "2026-11-20T00:00:00Z" },
      ])),
      [["Odd date", null], ["Fine", "2026-11-20T00:00:00Z"]],
    ],
  ])("%s", async (_name, id, reply, expected) => {
    const items = normalizeItems((await search(id, reply)).items);
    expect(items.map((i) => [i.title, i.publishedAt])).toEqual(expected);
    expect(items.map((i) => i.rank)).toEqual(expected.map((_, i) => i + 1));
  });
});

describe("numbers out of range never suspend a source for ever", () => {
  it.each([
    ["stackoverflow backoff", "stackoverflow", json(JSON.stringify(stackoverflowBody([], { backoff: 1e300 })))],
  ] as const)("%s is capped", async (_name, id, reply) => {
    const answer = await search(id, reply);
    expect(answer.pauseMs).toBe(MAX_PAUSE_MS);
    expect(answer.note).toBe(`upstream asked for a ${MAX_PAUSE_MS / 1000} s pause; source paused`);
  });

  it.each([
    ["brave Retry-After", "brave", { status: 429, headers: { "retry-after": "9".repeat(400) }, body: {} }],
    ["github x-ratelimit-reset", "github", { status: 403, headers: { "x-ratelimit-remaining": "0", "x-ratelimit-reset": "1e300" }, body: {} }],
    ["stackoverflow throttle seconds", "stackoverflow", { status: 400, body: { error_id: 502, error_message: `more requests available in ${"9".repeat(400)} seconds` } }],
  ] as const)("%s is capped", async (_name, id, reply) => {
    const err = await search(id, reply as FakeReply).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(SourceFailure);
    expect([(err as SourceFailure).kind, (err as SourceFailure).opts.retryAfterMs]).toEqual(["rate_limited", MAX_PAUSE_MS]);
  });
});

describe("cleanDate", () => {
  it.each([
    ["2026-02-30T00:00:00Z", null],
    ["2026-13-01T00:00:00Z", null],
    ["+275760-09-14T00:00:00Z", null],
    ["2024-02-29T12:00:00Z", "2024-02-29T12:00:00Z"],
    ["2026-11-22T23:30:00-05:00", "2026-11-23T04:30:00Z"],
  ])("%s → %s", (raw, expected) => {
    expect(cleanDate(raw)).toBe(expected);
  });
});

describe("through the engine", () => {
  it("hackernews answering {\"hits\":null} is an error, costs nothing, and the other sources still answer", async () => {
    shared.current.providers.hackernews.reply(json('{"hits":null}'));
    const engine = createSearchEngine({ config: { requestTimeoutMs: 3_000, env: shared.current.env }, logger, now: () => NOW });
    try {
      const plan = engine.resolve(create(SearchRequestSchema, { q: "rust async", s: ["hackernews", "wikipedia"] }));
      const outcome = await engine.search(plan, "rust async", new AbortController().signal);
      const hn = outcome.sources.find((s) => s.id === "hackernews");
      expect(hn).toMatchObject({ status: "error", reason: UNEXPECTED_SHAPE, costCredits: 0 });
      expect(outcome.sources.find((s) => s.id === "wikipedia")?.status).toBe("ok");
      expect(outcome.chargeUnits).toBe(500);
    } finally {
      engine.close();
    }
  });

  it("one hackernews hit dated 1e20 costs the source nothing but its own date", async () => {
    shared.current.providers.hackernews.reply(json(JSON.stringify({
      hits: [
        { objectID: "1", title: "Far future", url: null, created_at_i: 1e20 },
        { objectID: "2", title: "Fine", url: null, created_at_i: Math.floor(NOW / 1000) },
      ],
    })));
    const engine = createSearchEngine({ config: { requestTimeoutMs: 3_000, env: shared.current.env }, logger, now: () => NOW });
    try {
      const plan = engine.resolve(create(SearchRequestSchema, { q: "rust async", s: ["hackernews"] }));
      const outcome = await engine.search(plan, "rust async", new AbortController().signal);
      expect(outcome.sources[0]).toMatchObject({ id: "hackernews", status: "ok", resultCount: 2 });
      expect(outcome.results.map((r) => [r.title, r.publishedAt ?? null])).toEqual([["Far future", null], ["Fine", "2026-11-23T06:00:00Z"]]);
    } finally {
      engine.close();
    }
  });
});
