import { create } from "@bufbuild/protobuf";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { describeError } from "../../src/errors.js";
import { SearchRequestSchema } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { createLogger } from "../../src/logger.js";
import { createSearchEngine, type SearchEngine } from "../../src/search/engine.js";
import {
  BRAVE_KEY, FAKE_SOURCE_IDS, brave429, defaultHandler, githubBody, stackoverflowBody, startFakeSearch,
  type FakeSearch, type FakeSourceId,
} from "../support/fake-search/providers.js";

/** The engine over real HTTP to the fake providers, with a hand-moved clock for windows, TTLs and budgets. */

// Off the whole second on purpose: date rules must not depend on a round clock.
let t = Date.parse("2026-11-23T06:00:00.437Z");
const now = () => t;
const logger = createLogger("silent");
let fakes: FakeSearch;

beforeAll(async () => {
  fakes = await startFakeSearch({ now });
});
afterAll(async () => {
  await fakes?.close();
});
beforeEach(() => fakes.reset());

function engine(env: Record<string, string> = {}, requestTimeoutMs = 3_000): SearchEngine {
  return createSearchEngine({ config: { requestTimeoutMs, env: { ...fakes.env, ...env } }, logger, now });
}
const request = (init: { q?: string; s?: string[]; w?: string } = {}) => create(SearchRequestSchema, { q: "rust async", ...init });
const signal = () => new AbortController().signal;
async function search(e: SearchEngine, init: { q?: string; s?: string[]; w?: string } = {}) {
  const plan = e.resolve(request(init));
  return { plan, outcome: await e.search(plan, init.q ?? "rust async", signal()) };
}
const statuses = (outcome: Awaited<ReturnType<typeof search>>["outcome"]) =>
  Object.fromEntries(outcome.sources.map((s) => [s.id, s.status]));
const report = (outcome: Awaited<ReturnType<typeof search>>["outcome"], id: string) => outcome.sources.find((s) => s.id === id);
const calls = (id: FakeSourceId) => fakes.providers[id].requests.length;
function thrown(fn: () => unknown) {
  try {
    fn();
  } catch (err) {
    return describeError(err);
  }
  throw new Error("expected an error");
}

describe("resolve", () => {
  it("s omitted = the configured default sources; w omitted = any; reserve = their prices", () => {
    const plan = engine().resolve(request());
    expect(plan).toMatchObject({ sources: ["brave", "exa", "wikipedia", "hackernews", "gdelt"], window: "any", notConfigured: [] });
    expect(plan.reserveUnits).toBe(6000 + 8000 + 500 + 500 + 500);
  });

  it("without keys the defaults are the free ones", () => {
    const plan = engine({ TYPESAFE_SEARCH_BRAVE_KEY: "", TYPESAFE_SEARCH_EXA_KEY: "" }).resolve(request());
    expect(plan.sources).toEqual(["wikipedia", "hackernews", "gdelt"]);
  });

  it("a source that cannot honour the window is not reserved for", () => {
    const plan = engine().resolve(request({ s: ["wikipedia", "brave"], w: "24h" }));
    expect([plan.sources, plan.reserveUnits]).toEqual([["brave", "wikipedia"], 6000]);
  });

  it("requested but not configured → reported, not reserved", () => {
    const plan = engine({ TYPESAFE_SEARCH_EXA_KEY: "" }).resolve(request({ s: ["exa", "github"] }));
    expect([plan.sources, plan.notConfigured, plan.reserveUnits]).toEqual([["github"], ["exa"], 500]);
  });

  it.each([
    ["unknown ids name the bad and the allowed ones", { s: ["google", "brave"] }, {}, "INVALID_ARGUMENT", "s", "unknown source ids google; allowed: brave, exa, wikipedia"],
    ["a window no requested source can honour", { s: ["wikipedia"], w: "7d" }, {}, "INVALID_ARGUMENT", "w", "w=7d cannot be honoured by wikipedia"],
    ["nothing configured", {}, { TYPESAFE_SEARCH_SOURCES: "none" }, "NOT_CONFIGURED", "", "no search source is enabled"],
    ["only unconfigured sources requested", { s: ["brave"] }, { TYPESAFE_SEARCH_BRAVE_KEY: "" }, "NOT_CONFIGURED", "", "none of the requested search sources is configured: brave"],
  ])("%s", (_name, init, env, reason, field, message) => {
    const error = thrown(() => engine(env).resolve(request(init)));
    expect([error.reason, error.detail.field]).toEqual([reason, field]);
    expect(error.message).toContain(message);
  });
});

describe("fan-out and merge", () => {
  it("queries every requested source once and merges across them", async () => {
    const { outcome } = await search(engine(), { s: [...FAKE_SOURCE_IDS] });
    expect(statuses(outcome)).toEqual({
      brave: "ok", exa: "ok", wikipedia: "ok", hackernews: "ok", stackoverflow: "ok", github: "ok", arxiv: "ok", gdelt: "ok",
    });
    for (const id of FAKE_SOURCE_IDS) expect(calls(id), id).toBe(1);
    expect(outcome.chargeUnits).toBe(6000 + 8000 + 6 * 500);
    expect(outcome.usage).toMatchObject({ sourcesRequested: 8, sourcesAnswered: 8, upstreamCalls: 8 });

    const guide = outcome.results[0]!;
    expect(guide).toMatchObject({
      url: "https://www.example.com/guide?utm_source=brave&ref=a",
      title: "Asynchronous Programming in Rust & Tokio",
      foundIn: [{ source: "brave", rank: 1 }, { source: "exa", rank: 1 }, { source: "gdelt", rank: 2 }],
    });
    const paper = outcome.results.find((r) => r.title === "Attention Is All You Need")!;
    expect(paper.foundIn).toEqual([{ source: "exa", rank: 2 }, { source: "arxiv", rank: 1 }]);
    expect(new Set(outcome.results.map((r) => r.url)).size).toBe(outcome.results.length);

    const github = outcome.sources.find((s) => s.id === "github")!;
    expect(github).toMatchObject({ reason: "upstream search timed out; results may be incomplete", resultCount: 1, cached: false, costCredits: 0.0005 });
  });

  it("is deterministic: the same answers give the same order", async () => {
    const e1 = engine();
    const e2 = engine();
    const a = await search(e1, { s: [...FAKE_SOURCE_IDS] });
    const b = await search(e2, { s: [...FAKE_SOURCE_IDS] });
    expect(b.outcome.results).toEqual(a.outcome.results);
  });

  it("w=24h: native filters, wikipedia skipped, results post-filtered to the exact cutoff", async () => {
    const { outcome } = await search(engine(), { s: ["wikipedia", "brave", "hackernews", "gdelt"], w: "24h" });
    expect(outcome.sources.find((s) => s.id === "wikipedia")).toMatchObject({ status: "skipped", reason: "source cannot filter by time window", costCredits: 0 });
    expect(calls("wikipedia")).toBe(0);
    expect(fakes.providers.brave.requests[0]!.query.get("freshness")).toBe("pd");
    // Brave's "3 weeks old" page is cut; its undated result stays (Brave filtered on its side).
    expect(outcome.results.filter((r) => (r.foundIn ?? []).some((f) => f.source === "brave")).map((r) => r.url)).toEqual([
      "https://www.example.com/guide?utm_source=brave&ref=a",
      "https://rust-lang.github.io/async-book/",
    ]);
    // GDELT's 26-hour-old article is cut even though GDELT returned it.
    expect(outcome.results.some((r) => (r.foundIn ?? []).some((f) => f.source === "gdelt" && f.rank === 2))).toBe(false);
    expect(outcome.results.every((r) => r.publishedAt === undefined || Date.parse(r.publishedAt) >= t - 86_400_000)).toBe(true);
  });

  it("requested but unconfigured sources are reported as not_configured at no cost", async () => {
    const { outcome } = await search(engine({ TYPESAFE_SEARCH_EXA_KEY: "" }), { s: ["exa", "hackernews"] });
    expect(outcome.sources.map((s) => [s.id, s.status, s.costCredits])).toEqual([["exa", "not_configured", 0], ["hackernews", "ok", 0.0005]]);
  });
});

describe("partial failure", () => {
  it("one times out, one errors, one is rate limited → the others answer with honest statuses", async () => {
    fakes.providers.gdelt.reply({ hang: true });
    const gdeltCut = fakes.providers.gdelt.nextAbandon();
    fakes.providers.exa.reply({ status: 500, body: { error: "internal SECRET-UPSTREAM-DETAIL" } });
    fakes.providers.brave.reply(brave429(30));
    const e = engine({ TYPESAFE_SEARCH_GDELT_TIMEOUT_MS: "300" });
    const started = performance.now();
    const { outcome } = await search(e, { s: ["brave", "exa", "hackernews", "github", "gdelt"] });
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(outcome.sources.map((s) => [s.id, s.status, s.reason, s.costCredits])).toEqual([
      ["brave", "rate_limited", "upstream rate limit reached", 0],
      ["exa", "error", "upstream answered HTTP 500", 0],
      ["hackernews", "ok", "", 0.0005],
      ["github", "ok", "upstream search timed out; results may be incomplete", 0.0005],
      ["gdelt", "timeout", "no answer within 300 ms", 0],
    ]);
    expect(outcome.chargeUnits).toBe(1000);
    expect(JSON.stringify(outcome)).not.toContain("SECRET");
    // The straggler's connection was closed by us, not left hanging.
    await gdeltCut;
    expect(fakes.providers.gdelt.abandoned()).toBeGreaterThanOrEqual(1);

    // Brave asked for 30 s: it is suspended (no call) until then, on the injected clock.
    const again = await search(e, { q: "another query", s: ["brave", "hackernews"] });
    expect(again.outcome.sources[0]).toMatchObject({ id: "brave", status: "suspended", reason: expect.stringContaining("retry in 30 s") });
    expect(calls("brave")).toBe(1);
    t += 30_000;
    fakes.providers.brave.reply(defaultHandler("brave", now));
    const later = await search(e, { q: "a third query", s: ["brave"] });
    expect(later.outcome.sources[0]!.status).toBe("ok");
    expect(calls("brave")).toBe(2);
  });

  it("nothing answered → UPSTREAM_FAILED listing each source's status", async () => {
    fakes.providers.hackernews.reply({ status: 503, body: "down" });
    fakes.providers.github.reply({ status: 401, body: { message: "Bad credentials" } });
    const e = engine();
    const plan = e.resolve(request({ s: ["hackernews", "github", "wikipedia"], w: "7d" }));
    const error = await e.search(plan, "rust async", signal()).then(() => undefined, describeError);
    expect(error?.reason).toBe("UPSTREAM_FAILED");
    expect(error?.detail.metadata).toEqual({
      source_hackernews: "error: upstream answered HTTP 503",
      source_github: "not_configured: upstream refused our credentials",
      source_wikipedia: "skipped: source cannot filter by time window",
    });
  });

  it("an empty answer is an answer: empty, charged", async () => {
    fakes.providers.github.reply({ body: githubBody([]) });
    const { outcome } = await search(engine(), { s: ["github"] });
    expect(outcome.sources[0]).toMatchObject({ status: "empty", resultCount: 0, costCredits: 0.0005 });
    expect(outcome.chargeUnits).toBe(500);
  });

  it("Stack Exchange `backoff`: this answer counts, the next request does not call", async () => {
    fakes.providers.stackoverflow.reply({ body: stackoverflowBody([], { backoff: 20 }) });
    const e = engine();
    const first = await search(e, { s: ["stackoverflow"] });
    expect(first.outcome.sources[0]).toMatchObject({ status: "empty", reason: "upstream asked for a 20 s pause; source paused" });
    const plan = e.resolve(request({ q: "other", s: ["stackoverflow"] }));
    await expect(e.search(plan, "other", signal())).rejects.toThrow("no search source answered");
    expect(calls("stackoverflow")).toBe(1);
  });

  it("repeated upstream errors suspend the source", async () => {
    fakes.providers.hackernews.reply({ status: 500, body: "oops" });
    const e = engine();
    for (const q of ["a", "b"]) await search(e, { q, s: ["hackernews", "github"] });
    const { outcome } = await search(e, { q: "c", s: ["hackernews", "github"] });
    expect(outcome.sources[0]).toMatchObject({ status: "suspended" });
    expect(calls("hackernews")).toBe(2);
  });
});

describe("rate budget", () => {
  it("no call is made when the provider's token is not available in time", async () => {
    const e = engine({ TYPESAFE_SEARCH_ARXIV_RATE: "1/3s", TYPESAFE_SEARCH_ARXIV_TIMEOUT_MS: "1000" });
    await search(e, { q: "one", s: ["arxiv", "hackernews"] });
    const { outcome } = await search(e, { q: "two", s: ["arxiv", "hackernews"] });
    expect(report(outcome, "arxiv")).toMatchObject({ id: "arxiv", status: "rate_limited", reason: "provider budget exhausted; no call made", costCredits: 0 });
    expect(calls("arxiv")).toBe(1);
    t += 3_000;
    const later = await search(e, { q: "three", s: ["arxiv"] });
    expect(later.outcome.sources[0]!.status).toBe("ok");
    expect(calls("arxiv")).toBe(2);
  });
});

describe("cache", () => {
  it("a repeat is served from the cache for free until its TTL; the window is part of the key", async () => {
    const e = engine();
    const first = await search(e, { s: ["hackernews"] });
    const second = await search(e, { q: "  rust   async ", s: ["hackernews"] });
    expect(second.outcome.sources[0]).toMatchObject({ status: "ok", cached: true, costCredits: 0 });
    expect(second.outcome.chargeUnits).toBe(0);
    expect(second.outcome.results).toEqual(first.outcome.results);
    expect(calls("hackernews")).toBe(1);

    await search(e, { s: ["hackernews"], w: "7d" });
    expect(calls("hackernews")).toBe(2);

    t += 60 * 60_000;
    const stale = await search(e, { s: ["hackernews"] });
    expect(stale.outcome.sources[0]!.cached).toBe(false);
    expect(calls("hackernews")).toBe(3);
  });

  it("failures are never cached", async () => {
    fakes.providers.github.reply({ status: 502, body: "bad gateway" });
    const e = engine();
    await search(e, { s: ["github", "hackernews"] });
    fakes.providers.github.reply(defaultHandler("github", now));
    const { outcome } = await search(e, { s: ["github", "hackernews"] });
    expect(report(outcome, "github")).toMatchObject({ status: "ok", cached: false });
    expect(calls("github")).toBe(2);
  });

  it("identical concurrent misses share one upstream call; only the leader pays", async () => {
    const slow = defaultHandler("exa", now);
    fakes.providers.exa.reply((req) => ({ ...slow(req), delayMs: 100 }));
    const e = engine();
    const runs = await Promise.all([1, 2, 3].map(() => search(e, { s: ["exa"] })));
    expect(calls("exa")).toBe(1);
    expect(runs.map((r) => r.outcome.chargeUnits).sort()).toEqual([0, 0, 8000]);
    expect(runs.map((r) => r.outcome.sources[0]!.cached).filter(Boolean)).toHaveLength(2);
  });

  it("a cache hit is served even while the source is suspended", async () => {
    const e = engine();
    await search(e, { s: ["brave"] });
    fakes.providers.brave.reply(brave429(60));
    await search(e, { q: "miss", s: ["brave", "hackernews"] });
    const { outcome } = await search(e, { s: ["brave"] });
    expect(outcome.sources[0]).toMatchObject({ status: "ok", cached: true });
    expect(fakes.providers.brave.requests.map((r) => r.headers["x-subscription-token"])).toEqual([BRAVE_KEY, BRAVE_KEY]);
  });
});
