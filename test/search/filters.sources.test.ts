import { create } from "@bufbuild/protobuf";
import knex from "knex";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { describeError } from "../../src/errors.js";
import { SearchRequestSchema } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { createLogger } from "../../src/logger.js";
import type { Meter } from "../../src/metering/meter.js";
import { createMetrics } from "../../src/metrics.js";
import { createSearchEngine, type SearchEngine } from "../../src/search/engine.js";
import { wikipediaApiBase } from "../../src/search/sources/wikipedia.js";
import {
  braveBody, braveFiltered, exaBody, exaFiltered, gdeltBody, gdeltFiltered, gdeltSeen, hackernewsBody, hackernewsPage, startFakeSearch,
  type FakeSearch, type FakeSourceId,
} from "../support/fake-search/providers.js";

/**
 * Each source with the filters, over real HTTP to the fakes: the native
 * parameter exactly as the provider documents it, typesafe's check catching
 * what a provider leaks, the per-source report, sources the filters rule out
 * never called, and a request without filters sent exactly as before.
 */

let t = Date.parse("2026-11-23T06:00:00.437Z");
const now = () => t;
const logger = createLogger("silent");
let fakes: FakeSearch;
const metricsDb = knex({ client: "pg" });
const metrics = createMetrics({ meter: {} as Meter, db: metricsDb, liveSessions: async () => 0 });

beforeAll(async () => {
  fakes = await startFakeSearch({ now });
});
afterAll(async () => {
  await fakes?.close();
  await metricsDb.destroy();
});
beforeEach(() => {
  fakes.reset();
  t += 3_600_000 * 2; // past every cache TTL of the previous test
});

type Init = { q?: string; s?: string[]; w?: string; d?: string[]; xd?: string[]; l?: string; c?: string; safe?: string };
function engine(env: Record<string, string> = {}): SearchEngine {
  return createSearchEngine({ config: { requestTimeoutMs: 3_000, env: { ...fakes.env, ...env } }, logger, now, metrics });
}
async function search(e: SearchEngine, init: Init) {
  const plan = e.resolve(create(SearchRequestSchema, { q: "rust async", ...init }));
  return e.search(plan, init.q ?? "rust async", new AbortController().signal);
}
type Outcome = Awaited<ReturnType<typeof search>>;
const report = (outcome: Outcome, id: string) => outcome.sources.find((s) => s.id === id)!;
const filtersOf = (outcome: Outcome, id: string) => report(outcome, id).filters;
const only = (id: FakeSourceId) => fakes.providers[id].requests;
const sent = (id: FakeSourceId) => {
  const r = only(id)[0]!;
  return `${r.method} ${r.path}?${r.query.toString()}${r.body ? ` ${r.body}` : ""}`;
};
const hostsOf = (outcome: Outcome) => outcome.results.map((r) => new URL(r.url!).hostname);

describe("without filters, every source is asked exactly as before", () => {
  it("the same upstream requests, byte for byte, and no filters in the report", async () => {
    const outcome = await search(engine(), { s: ["brave", "exa", "wikipedia", "hackernews", "stackoverflow", "github", "arxiv", "gdelt"] });
    expect(Object.fromEntries((["brave", "exa", "wikipedia", "hackernews", "stackoverflow", "github", "arxiv", "gdelt"] as const).map((id) => [id, sent(id)]))).toEqual({
      brave: "GET /res/v1/web/search?q=rust+async&count=10",
      exa: 'POST /search? {"query":"rust async","type":"auto","numResults":10,"contents":{"highlights":{"maxCharacters":400}}}',
      wikipedia: "GET /w/api.php?action=query&list=search&srsearch=rust+async&srlimit=10&srprop=snippet%7Ctimestamp&format=json&formatversion=2",
      hackernews: "GET /api/v1/search?query=rust+async&tags=story&hitsPerPage=10",
      stackoverflow: "GET /2.3/search/advanced?q=rust+async&site=stackoverflow&sort=relevance&order=desc&pagesize=10",
      github: "GET /search/repositories?q=rust+async&per_page=10",
      arxiv: "GET /api/query?search_query=all%3Arust+AND+all%3Aasync&start=0&max_results=10&sortBy=relevance&sortOrder=descending",
      gdelt: "GET /api/v2/doc/doc?query=rust+async&mode=ArtList&format=json&maxrecords=10&sort=HybridRel",
    });
    for (const source of outcome.sources) expect(Object.keys(source)).not.toContain("filters");
  });
});

describe("brave", () => {
  it("site: for the one domain to keep, -site: for each to drop, search_lang, country, safesearch, count=20", async () => {
    const outcome = await search(engine(), { s: ["brave"], d: ["tokio.rs"], xd: ["example.com", "*.ads.example"], l: "ja", c: "GB", safe: "strict" });
    const req = only("brave")[0]!;
    // A "*." entry to drop is not sent (Brave's -site: would drop the domain itself too): typesafe checks it.
    expect(req.query.get("q")).toBe("rust async site:tokio.rs");
    expect([req.query.get("search_lang"), req.query.get("country"), req.query.get("safesearch"), req.query.get("count")]).toEqual(["jp", "GB", "strict", "20"]);
    expect(filtersOf(outcome, "brave")).toEqual({
      d: { applied: "native", dropped: 0 },
      xd: { applied: "post_filtered", dropped: 0 },
      l: { applied: "native", dropped: 0 },
      c: { applied: "native", dropped: 0 },
      safe: { applied: "native", dropped: 0 },
    });
    // The fake's results are all in English, which search_lang=jp leaves out, as Brave would.
    expect([report(outcome, "brave").status, hostsOf(outcome)]).toEqual(["empty", []]);
  });

  it("several domains to keep are checked by typesafe; -site: carries the ones to drop", async () => {
    const outcome = await search(engine(), { s: ["brave"], d: ["tokio.rs", "github.io"], xd: ["example.com"] });
    expect(only("brave")[0]!.query.get("q")).toBe("rust async -site:example.com");
    expect(hostsOf(outcome).sort()).toEqual(["rust-lang.github.io", "tokio.rs"]);
    expect(filtersOf(outcome, "brave")).toMatchObject({ d: { applied: "post_filtered", dropped: 0 }, xd: { applied: "native", dropped: 0 } });
  });

  it("operators that would pass 50 words stay out of the query; typesafe drops instead", async () => {
    const q = Array.from({ length: 40 }, (_, i) => `w${i}`).join(" ");
    const outcome = await search(engine(), { q, s: ["brave"], xd: Array.from({ length: 12 }, (_, i) => `drop${i}.example`) });
    expect(only("brave")[0]!.query.get("q")).toBe(q);
    expect(filtersOf(outcome, "brave")!.xd).toEqual({ applied: "post_filtered", dropped: 0 });
  });

  it("a language Brave has no search_lang for is checked on each result's stated language", async () => {
    fakes.providers.brave.reply((req) => {
      const results = braveFiltered([
        { title: "Gaeilge", url: "https://ga.example/a", description: "x", language: "ga" },
        { title: "English", url: "https://en.example/b", description: "y", language: "en" },
      ], req);
      return Array.isArray(results) ? { body: braveBody(results) } : results;
    });
    const outcome = await search(engine(), { s: ["brave"], l: "ga", c: "IE" });
    expect(only("brave")[0]!.query.has("search_lang")).toBe(false);
    expect(only("brave")[0]!.query.has("country")).toBe(false);
    expect(hostsOf(outcome)).toEqual(["ga.example"]);
    expect(filtersOf(outcome, "brave")).toEqual({ l: { applied: "post_filtered", dropped: 1 }, c: { applied: "unsupported", dropped: 0 } });
  });
});

describe("exa", () => {
  it("includeDomains, excludeDomains and moderation in the body", async () => {
    await search(engine(), { s: ["exa"], d: ["example.com", "*.doi.org"], xd: ["bad.example.com"], safe: "moderate" });
    expect(JSON.parse(only("exa")[0]!.body)).toMatchObject({ includeDomains: ["example.com", "doi.org"], excludeDomains: ["bad.example.com"], moderation: true, numResults: 10 });
  });

  it("a leaked excluded domain is caught and reported against the native filter", async () => {
    fakes.providers.exa.reply((req) => ({
      body: exaBody(exaFiltered([
        { title: "Kept", url: "https://kept.example/a" },
        { title: "Leaked", url: "https://blog.spam.example/b" },
        { title: "Excluded", url: "https://spam.example/c" },
      ], req)),
    }));
    const drops = async () =>
      (await metrics.registry.getSingleMetric("typesafe_search_filter_dropped_total")!.get()).values.find((v) => v.labels["source"] === "exa" && v.labels["filter"] === "xd")?.value ?? 0;
    const before = await drops();
    const outcome = await search(engine(), { s: ["exa"], xd: ["spam.example"] });
    expect(hostsOf(outcome)).toEqual(["kept.example"]);
    expect(filtersOf(outcome, "exa")).toEqual({ xd: { applied: "native", dropped: 1 } });
    expect(await drops()).toBe(before + 1);
  });

  it("language and country are unsupported: results kept, the report says so", async () => {
    const outcome = await search(engine(), { s: ["exa"], l: "de", c: "DE" });
    expect(report(outcome, "exa").resultCount).toBe(2);
    expect(filtersOf(outcome, "exa")).toEqual({ l: { applied: "unsupported", dropped: 0 }, c: { applied: "unsupported", dropped: 0 } });
  });
});

describe("gdelt", () => {
  const articles = () => [
    { url: "https://www.bbc.co.uk/news/1", title: "UK story one", seendate: gdeltSeen(t - 3_600_000), domain: "bbc.co.uk", language: "English", sourcecountry: "United Kingdom" },
    { url: "https://notbbc.co.uk/2", title: "A lookalike domain", seendate: gdeltSeen(t - 3_600_000), domain: "notbbc.co.uk", language: "English", sourcecountry: "United Kingdom" },
    { url: "https://www.spiegel.de/3", title: "Deutsche Meldung", seendate: gdeltSeen(t - 3_600_000), domain: "spiegel.de", language: "German", sourcecountry: "Germany" },
  ];

  it("domain:, -domain:, sourcelang: and sourcecountry: operators; a larger page", async () => {
    await search(engine(), { s: ["gdelt"], d: ["bbc.co.uk", "spiegel.de"], xd: ["sport.bbc.co.uk"], l: "en", c: "GB" });
    const req = only("gdelt")[0]!;
    expect(req.query.get("query")).toBe("rust async (domain:bbc.co.uk OR domain:spiegel.de) -domain:sport.bbc.co.uk sourcelang:english sourcecountry:unitedkingdom");
    expect(req.query.get("maxrecords")).toBe("30");
  });

  it("domain: matches substrings at GDELT, so a lookalike domain leaks; typesafe drops it", async () => {
    fakes.providers.gdelt.reply((req) => ({ headers: { "content-type": "application/json" }, body: gdeltBody(gdeltFiltered(articles(), req)) }));
    const outcome = await search(engine(), { s: ["gdelt"], d: ["bbc.co.uk"] });
    expect(hostsOf(outcome)).toEqual(["www.bbc.co.uk"]);
    expect(filtersOf(outcome, "gdelt")).toEqual({ d: { applied: "native", dropped: 1 } });
  });

  it("the stated language and country are checked too", async () => {
    fakes.providers.gdelt.reply({ headers: { "content-type": "application/json" }, body: gdeltBody(articles()) });
    const outcome = await search(engine(), { s: ["gdelt"], l: "de", c: "DE" });
    expect(hostsOf(outcome)).toEqual(["www.spiegel.de"]);
    expect(filtersOf(outcome, "gdelt")).toEqual({ l: { applied: "native", dropped: 2 }, c: { applied: "native", dropped: 0 } });
  });
});

describe("wikipedia", () => {
  it("the language is the wiki: a {lang} mirror URL gets the code, results link that wiki", async () => {
    const e = engine({ TYPESAFE_SEARCH_WIKIPEDIA_URL: `${fakes.providers.wikipedia.url}/{lang}` });
    const outcome = await search(e, { s: ["wikipedia"], l: "de", d: ["wikipedia.org"] });
    expect(only("wikipedia")[0]!.path).toBe("/de/w/api.php");
    expect(new Set(hostsOf(outcome))).toEqual(new Set(["de.wikipedia.org"]));
    expect(filtersOf(outcome, "wikipedia")).toEqual({ d: { applied: "native", dropped: 0 }, l: { applied: "native", dropped: 0 } });
  });

  it("a base URL of one language cannot serve another; an excluded wikipedia.org is not called", async () => {
    const e = engine();
    const other = await search(e, { s: ["wikipedia", "hackernews"], l: "de" });
    expect([report(other, "wikipedia").status, report(other, "wikipedia").reason]).toEqual(["filtered_out", "the configured Wikipedia URL serves English only, not de"]);
    const dropped = await search(e, { s: ["wikipedia", "hackernews"], xd: ["wikipedia.org"] });
    expect([report(dropped, "wikipedia").status, report(dropped, "wikipedia").reason, report(dropped, "wikipedia").costCredits]).toEqual([
      "filtered_out", "xd excludes en.wikipedia.org, the only site this source searches", 0,
    ]);
    expect(only("wikipedia")).toHaveLength(0);
  });
});

describe("stackoverflow", () => {
  it.each([
    [{ d: ["superuser.com"] }, "superuser.com", "superuser.com"],
    [{ l: "es" }, "es.stackoverflow.com", "es.stackoverflow.com"],
    [{ d: ["unix.stackexchange.com", "stackoverflow.com"], xd: ["meta.stackoverflow.com"] }, "unix.stackexchange.com", "unix.stackexchange.com"],
    [{ d: ["example.com", "unix.stackexchange.com"] }, "unix.stackexchange.com", "unix.stackexchange.com"],
    [{ l: "en" }, "stackoverflow", "stackoverflow.com"],
  ])("%j → site=%s", async (init, site, host) => {
    const outcome = await search(engine(), { s: ["stackoverflow"], ...init });
    expect(only("stackoverflow")[0]!.query.get("site")).toBe(site);
    expect(hostsOf(outcome)).toEqual([host]);
  });

  it("no site in the language, or the domains leave none: filtered_out, not called", async () => {
    const e = engine();
    const lang = await search(e, { s: ["stackoverflow", "hackernews"], l: "de" });
    expect([report(lang, "stackoverflow").status, report(lang, "stackoverflow").reason]).toEqual(["filtered_out", "Stack Overflow has no site in language de"]);
    const domains = await search(e, { s: ["stackoverflow", "hackernews"], d: ["example.com"] });
    expect(report(domains, "stackoverflow").status).toBe("filtered_out");
    expect(only("stackoverflow")).toHaveLength(0);
  });
});

describe("github, arxiv: one site each", () => {
  it("a domain list without their site rules them out before any call; with it, native", async () => {
    const e = engine();
    const out = await search(e, { s: ["github", "arxiv", "hackernews"], xd: ["github.com"], d: ["arxiv.org", "bitbashing.io", "ycombinator.com"] });
    expect([report(out, "github").status, report(out, "arxiv").status]).toEqual(["filtered_out", "ok"]);
    expect(filtersOf(out, "arxiv")).toEqual({ d: { applied: "native", dropped: 0 }, xd: { applied: "native", dropped: 0 } });
    expect(only("github")).toHaveLength(0);
  });

  it("every chosen source ruled out: 400 naming the filter, before any money", () => {
    let error;
    try {
      engine().resolve(create(SearchRequestSchema, { q: "rust", s: ["github", "arxiv"], xd: ["github.com", "arxiv.org"] }));
    } catch (err) {
      error = describeError(err);
    }
    expect(error).toMatchObject({ reason: "INVALID_ARGUMENT", detail: { field: "xd", rule: "leaves_a_source" } });
  });

  it("a source ruled out is not reserved for", () => {
    const plan = engine().resolve(create(SearchRequestSchema, { q: "rust", s: ["github", "hackernews"], xd: ["github.com"] }));
    expect(plan.reserveUnits).toBe(500);
  });
});

describe("hackernews", () => {
  it("no native parameter: a page of 50, typesafe checks each story's link; language cannot be checked", async () => {
    fakes.providers.hackernews.reply((req) => ({
      body: hackernewsBody(hackernewsPage(req, Array.from({ length: 60 }, (_, i) => ({
        objectID: String(1000 + i), title: `story ${i}`, url: i % 3 === 0 ? null : `https://${i % 3 === 1 ? "kept" : "other"}.example/${i}`,
        author: "a", points: 1, num_comments: 1, created_at_i: Math.floor(t / 1000) - 60,
      })))),
    }));
    const outcome = await search(engine(), { s: ["hackernews"], d: ["kept.example"], l: "en" });
    expect(only("hackernews")[0]!.query.get("hitsPerPage")).toBe("50");
    expect(new Set(hostsOf(outcome))).toEqual(new Set(["kept.example"]));
    // The page is filled back to 10 from the larger fetch.
    expect(report(outcome, "hackernews").resultCount).toBe(10);
    expect(filtersOf(outcome, "hackernews")).toEqual({ d: { applied: "post_filtered", dropped: 33 }, l: { applied: "unsupported", dropped: 0 } });
    // The discussion link (news.ycombinator.com) is outside d: removed from the kept stories.
    expect(outcome.results.every((r) => r.discussionUrl === undefined)).toBe(true);
  });
});

describe("cache", () => {
  it("other filters are another upstream call; the same filters are a cache hit, checked again", async () => {
    const e = engine();
    await search(e, { s: ["hackernews"], d: ["bitbashing.io"] });
    await search(e, { s: ["hackernews"], d: ["example.org"] });
    const hit = await search(e, { s: ["hackernews"], d: ["bitbashing.io"] });
    expect(only("hackernews")).toHaveLength(2);
    expect([report(hit, "hackernews").cached, hostsOf(hit)]).toEqual([true, ["bitbashing.io"]]);
    await search(e, { s: ["hackernews"] });
    expect(only("hackernews")).toHaveLength(3);
  });
});

describe("wikipediaApiBase", () => {
  it.each([
    ["https://en.wikipedia.org", "de", "https://de.wikipedia.org"],
    ["https://en.wikipedia.org", "en", "https://en.wikipedia.org"],
    ["https://en.wikipedia.org/proxy", "fr", "https://fr.wikipedia.org/proxy"],
    ["http://mirror.example/%7Blang%7D", "ja", "http://mirror.example/ja"],
    ["http://mirror.example/w-{lang}", "es", "http://mirror.example/w-es"],
    ["http://mirror.example", "en", "http://mirror.example"],
    ["http://mirror.example", "de", undefined],
  ])("%s with %s → %s", (base, lang, expected) => {
    expect(wikipediaApiBase(base, lang)).toBe(expected);
  });
});
