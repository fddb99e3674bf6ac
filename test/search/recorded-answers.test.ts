import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { SearchRequestSchema } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { createLogger, type Logger } from "../../src/logger.js";
import { createSearchEngine } from "../../src/search/engine.js";
import { normalizeItems } from "../../src/search/merge.js";
import { createBraveSource } from "../../src/search/sources/brave.js";
import { createExaSource } from "../../src/search/sources/exa.js";
import { createGdeltSource, gdeltQuery } from "../../src/search/sources/gdelt.js";
import { createGitHubSource } from "../../src/search/sources/github.js";
import { createHackerNewsSource } from "../../src/search/sources/hackernews.js";
import { articlePath, createWikipediaSource } from "../../src/search/sources/wikipedia.js";
import { SourceFailure } from "../../src/search/sources/source-failure.js";
import type { SearchSource, SourceAnswer, SourceSettings } from "../../src/search/sources/types.js";
import type { SearchWindow } from "../../src/search/validate.js";
import { BRAVE_KEY, EXA_KEY, exaBody, gdeltSeen, hackernewsBody, type FakeSourceId } from "../support/fake-search/providers.js";
import {
  BRAVE_QUOTA_LIMITED, BRAVE_RATE_LIMITED, BRAVE_TOKEN_INVALID, BRAVE_VALIDATION, EXA_INVALID_REQUEST_BODY, EXA_NO_MORE_CREDITS,
  GDELT_200_NOTICE, GITHUB_SECONDARY_LIMIT, WIKIPEDIA_UA_BLOCK, gdeltBadEscapeBody,
} from "../support/fake-search/recorded.js";
import { useFakeSearch } from "../support/fake-search/per-file.js";

/**
 * The providers' real error answers (test/support/fake-search/recorded.ts,
 * each quoted from docs or a recorded response) and what each one does: the
 * caller's query → that source is `error`, nothing suspended; the operator's
 * key, User-Agent or quota → `not_configured` with the reason, logged once;
 * the provider's rate limit → paused for the time its own headers state.
 */

// Off the whole second on purpose: GitHub's date syntax has no fractions.
let t = Date.parse("2026-11-23T06:00:00.437Z");
const now = () => t;
const USER_AGENT = "typesafe-search/1.0 (+ops@typesafe.test)";
const shared = useFakeSearch(now);

function source(id: FakeSourceId, factory: (s: SourceSettings) => SearchSource, key?: string): SearchSource {
  return factory({ baseUrl: shared.current.providers[id].url, key, userAgent: USER_AGENT, logger: createLogger("silent") });
}
function run(adapter: SearchSource, window: SearchWindow = "any", query = "rust async"): Promise<SourceAnswer> {
  return adapter.search({ query, window, nowMs: t, signal: AbortSignal.timeout(5_000) });
}
async function failure(promise: Promise<unknown>): Promise<SourceFailure> {
  const err = await promise.then(() => undefined, (e: unknown) => e);
  expect(err).toBeInstanceOf(SourceFailure);
  return err as SourceFailure;
}

/** A logger that keeps error lines, to count "logged once". */
function recordingLogger(): { logger: Logger; errors: Record<string, unknown>[] } {
  const errors: Record<string, unknown>[] = [];
  const make = (bound: Record<string, unknown>): Logger => ({
    debug() {}, info() {}, warn() {},
    error(message: string, fields?: Record<string, unknown>) {
      errors.push({ message, ...bound, ...fields });
    },
    child(fields: Record<string, unknown>) {
      return make({ ...bound, ...fields });
    },
  } as unknown as Logger);
  return { logger: make({}), errors };
}
function engine(logger: Logger = createLogger("silent")) {
  return createSearchEngine({ config: { requestTimeoutMs: 3_000, env: shared.current.env }, logger, now });
}
async function search(e: ReturnType<typeof engine>, s: string[], q = "rust async", w = "any") {
  const plan = e.resolve(create(SearchRequestSchema, { q, s, w }));
  const outcome = await e.search(plan, q, new AbortController().signal);
  return (id: string) => outcome.sources.find((r) => r.id === id)!;
}
const calls = (id: FakeSourceId) => shared.current.providers[id].requests.length;

describe("github", () => {
  it("pushed:>= carries whole seconds even when the clock does not", async () => {
    await run(source("github", createGitHubSource), "24h");
    expect(shared.current.providers.github.requests[0]!.query.get("q")).toBe("rust async pushed:>=2026-11-22T06:00:00Z");
  });

  it("a secondary limit (403, no retry-after, remaining 27) is a rate limit of ≥ 60 s, doubling while it repeats", async () => {
    const github = source("github", createGitHubSource, "ghp_test");
    shared.current.providers.github.reply(GITHUB_SECONDARY_LIMIT);
    const first = await failure(run(github));
    const second = await failure(run(github));
    expect([first.kind, first.opts.retryAfterMs, second.opts.retryAfterMs]).toEqual(["rate_limited", 60_000, 120_000]);
  });
});

describe("brave", () => {
  it("422 SUBSCRIPTION_TOKEN_INVALID is the operator's key: not_configured with the reason, logged once, no further calls", async () => {
    shared.current.providers.brave.reply(BRAVE_TOKEN_INVALID);
    const { logger, errors } = recordingLogger();
    const e = engine(logger);
    const first = (await search(e, ["brave", "hackernews"]))("brave");
    const second = (await search(e, ["brave", "hackernews"], "another query"))("brave");
    for (const report of [first, second]) {
      expect(report).toMatchObject({ status: "not_configured", reason: expect.stringContaining("TYPESAFE_SEARCH_BRAVE_KEY") });
    }
    expect(calls("brave")).toBe(1);
    expect(errors.filter((line) => line["source"] === "brave")).toHaveLength(1);
  });

  it("422 VALIDATION is the caller's query: error for that call, never a suspension for everyone", async () => {
    shared.current.providers.brave.reply(BRAVE_VALIDATION);
    const e = engine();
    for (const q of ["first long query", "second long query", "third long query"]) {
      expect((await search(e, ["brave", "hackernews"], q))("brave")).toMatchObject({ status: "error", reason: expect.stringContaining("rejected the query") });
    }
    expect(calls("brave")).toBe(3);
  });

  it("429 RATE_LIMITED pauses for X-RateLimit-Reset of the spent window (1 s), not 180 s", async () => {
    shared.current.providers.brave.reply(BRAVE_RATE_LIMITED);
    const err = await failure(run(source("brave", createBraveSource, BRAVE_KEY)));
    expect([err.kind, err.opts.retryAfterMs]).toEqual(["rate_limited", 1_000]);
  });

  it("429 QUOTA_LIMITED is the operator's plan: not_configured until the monthly window resets (checked at most daily)", async () => {
    shared.current.providers.brave.reply(BRAVE_QUOTA_LIMITED);
    const err = await failure(run(source("brave", createBraveSource, BRAVE_KEY)));
    expect([err.kind, err.opts.retryAfterMs]).toEqual(["quota", 24 * 3600_000]);
    const e = engine();
    expect((await search(e, ["brave", "hackernews"]))("brave")).toMatchObject({ status: "not_configured", reason: expect.stringContaining("monthly quota") });
    t += 3 * 60_000 + 1;
    expect((await search(e, ["brave", "hackernews"], "later"))("brave").status).toBe("not_configured");
    expect(calls("brave")).toBe(2);
  });
});

describe("gdelt", () => {
  it("an invalid JSON escape costs one character, not the answer", async () => {
    shared.current.providers.gdelt.reply({ headers: { "content-type": "application/json; charset=utf-8" }, body: gdeltBadEscapeBody(gdeltSeen(t - 3_600_000)) });
    const items = normalizeItems((await run(source("gdelt", createGdeltSource))).items);
    expect(items.map((i) => i.title)).toEqual(["Ukraine's talks resume in Geneva"]);
  });

  it("the rate notice as HTTP 200 text is a rate limit (paused 6 s), not a rejected query", async () => {
    shared.current.providers.gdelt.reply(GDELT_200_NOTICE);
    const err = await failure(run(source("gdelt", createGdeltSource)));
    expect([err.kind, err.opts.retryAfterMs]).toEqual(["rate_limited", 6_000]);
  });

  it("keywords under 3 characters are dropped locally; a query of only such keywords is skipped without spending GDELT's token", async () => {
    expect(gdeltQuery("AI regulation in EU")).toBe("regulation");
    expect(gdeltQuery('"AI act" OR eu')).toBe('"AI act"');
    const e = engine();
    expect((await search(e, ["gdelt", "hackernews"], "AI EU"))("gdelt")).toMatchObject({ status: "skipped", reason: expect.stringContaining("3 characters") });
    expect(calls("gdelt")).toBe(0);
    expect((await search(e, ["gdelt", "hackernews"], "AI regulation"))("gdelt").status).toBe("ok");
    expect(shared.current.providers.gdelt.requests[0]!.query.get("query")).toBe("regulation");
  });
});

describe("wikipedia", () => {
  it("article paths follow MediaWiki's wfUrlencode", () => {
    expect(articlePath("Washington, D.C.")).toBe("Washington,_D.C.");
    expect(articlePath("Ender's Game")).toBe("Ender%27s_Game");
    expect(articlePath("AC/DC")).toBe("AC/DC");
    expect(articlePath("C++")).toBe("C%2B%2B");
    expect(articlePath("Café (film)")).toBe("Caf%C3%A9_(film)");
  });

  it("a User-Agent block (403) tells the operator to set the User-Agent", async () => {
    shared.current.providers.wikipedia.reply(WIKIPEDIA_UA_BLOCK);
    const report = (await search(engine(), ["wikipedia", "hackernews"]))("wikipedia");
    expect(report).toMatchObject({ status: "not_configured", reason: expect.stringContaining("User-Agent") });
  });
});

describe("hackernews", () => {
  it("story_text paragraphs stay apart", async () => {
    // Algolia's story_text is HTML with <p> between paragraphs (hn.algolia.com/api, "story_text").
    shared.current.providers.hackernews.reply({
      body: hackernewsBody([{ objectID: "41000001", title: "Ask HN: Is a CS degree worth it in 2024?", url: null, author: "throwaway", points: 12, num_comments: 30, created_at_i: Math.floor(t / 1000), story_text: "Is it worth it<p>in 2024?<p>Thanks" }]),
    });
    const [item] = normalizeItems((await run(source("hackernews", createHackerNewsSource))).items);
    expect(item).toMatchObject({ url: "https://news.ycombinator.com/item?id=41000001", discussionUrl: undefined, snippet: "Is it worth it in 2024? Thanks" });
  });
});

describe("exa", () => {
  it("a result with title: null keeps its place, titled by its URL", async () => {
    shared.current.providers.exa.reply({ body: exaBody([{ title: null, url: "https://example.org/untitled", publishedDate: null, highlights: ["text"] }]) });
    const items = normalizeItems((await run(source("exa", createExaSource, EXA_KEY))).items);
    expect(items.map((i) => [i.title, i.url])).toEqual([["https://example.org/untitled", "https://example.org/untitled"]]);
  });

  it("400 INVALID_REQUEST_BODY is the request's fault; 402 is the operator's credits", async () => {
    shared.current.providers.exa.reply(EXA_INVALID_REQUEST_BODY);
    const bad = await failure(run(source("exa", createExaSource, EXA_KEY)));
    expect([bad.kind, bad.upstreamFault]).toEqual(["error", false]);
    shared.current.providers.exa.reply(EXA_NO_MORE_CREDITS);
    const e = engine();
    expect((await search(e, ["exa", "hackernews"]))("exa")).toMatchObject({ status: "not_configured", reason: expect.stringContaining("credits") });
  });
});

describe("hackernews links", () => {
  it("an article URL that is not http(s) falls back to the discussion instead of dropping the hit", async () => {
    shared.current.providers.hackernews.reply({
      body: hackernewsBody([{ objectID: "41000002", title: "Show HN: a gopher site", url: "gopher://example.org/1/", author: "a", points: 3, num_comments: 1, created_at_i: Math.floor(t / 1000) }]),
    });
    const items = normalizeItems((await run(source("hackernews", createHackerNewsSource))).items);
    expect(items.map((i) => [i.url, i.discussionUrl])).toEqual([["https://news.ycombinator.com/item?id=41000002", undefined]]);
  });
});
