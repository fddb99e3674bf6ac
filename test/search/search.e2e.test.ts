import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { SearchService } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { balanceUnits, createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { startFakeSearch, type FakeSearch } from "../support/fake-search/providers.js";
import { assertInvariants } from "../support/invariants.js";

/**
 * The real app over real HTTP against the fake providers and a real
 * database: the envelope, per-source report, resolved s/w, and the money
 * (reserved = resolved prices, charged = answered sources, cache hits free,
 * 502 releases everything).
 */

const CREDITS = 1_000_000;
let database: TestDatabase;
let fakes: FakeSearch;
let service: TestApp;

beforeAll(async () => {
  database = await createTestDatabase();
  fakes = await startFakeSearch();
  service = await startTestApp(database, { ...fakes.env, TYPESAFE_SEARCH_GDELT_TIMEOUT_MS: "400" });
});
afterAll(async () => {
  await service?.stop();
  await fakes?.close();
  await database?.close();
});
beforeEach(() => fakes.reset());

async function account(units = 1 * CREDITS) {
  return createTestAccount(database.db, { units });
}
async function holdsOf(accountId: string) {
  const rows = await database.db("requests").where({ account_id: accountId }).orderBy("created_at").select("reserved", "charged", "status", "endpoint");
  return rows.map((r) => ({ reserved: Number(r.reserved), charged: Number(r.charged), status: r.status, endpoint: r.endpoint }));
}
const search = (body: unknown, apiKey: string, headers: Record<string, string> = {}) =>
  postJson(`${service.url}/api/v1/search`, body, { apiKey, headers });

describe("POST /api/v1/search", () => {
  it("answers the defaults with merged results, a per-source report and the cost", async () => {
    const { apiKey, accountId } = await account();
    const { status, body } = await search({ q: "rust async" }, apiKey);
    expect(status).toBe(200);
    expect([body.code, body.message]).toEqual([0, "ok"]);
    const data = body.data as Record<string, any>;
    expect(data["q"]).toBe("rust async");
    expect(data["s"]).toEqual(["brave", "exa", "wikipedia", "hackernews", "gdelt"]);
    expect(data["w"]).toBe("any");
    expect(data["sources"].map((s: any) => [s.id, s.status, s.cached, s.cost_credits])).toEqual([
      ["brave", "ok", false, 0.006],
      ["exa", "ok", false, 0.008],
      ["wikipedia", "ok", false, 0.0005],
      ["hackernews", "ok", false, 0.0005],
      ["gdelt", "ok", false, 0.0005],
    ]);
    for (const report of data["sources"]) {
      expect(Object.keys(report).sort()).toEqual(["cached", "cost_credits", "id", "latency_ms", "reason", "result_count", "status"]);
    }
    const first = data["results"][0];
    expect(first).toEqual({
      title: "Asynchronous Programming in Rust & Tokio",
      url: "https://www.example.com/guide?utm_source=brave&ref=a",
      snippet: "Futures are lazy: nothing happens until they are polled by an executor, which is the longest snippet of all.",
      published_at: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/),
      score: 1 / 61 + 1 / 61 + 1 / 62,
      found_in: [{ source: "brave", rank: 1 }, { source: "exa", rank: 1 }, { source: "gdelt", rank: 2 }],
      discussion_url: null,
    });
    expect(data["results"].find((r: any) => r.url === "https://rust-lang.github.io/async-book/").published_at).toBeNull();
    expect(data["usage"]).toMatchObject({ sources_requested: 5, sources_answered: 5, upstream_calls: 5, results: data["results"].length });
    expect(data["cost"]).toMatchObject({ funding: "paid", reserved_credits: 0.0155, charged_credits: 0.0155, balance_credits: 0.9845 });
    expect(await balanceUnits(database.db, accountId)).toBe(CREDITS - 15_500);
    expect(await holdsOf(accountId)).toEqual([{ reserved: 15_500, charged: 15_500, status: "settled", endpoint: "search" }]);
    await assertInvariants(database.db, accountId);
    expect(JSON.stringify(body)).not.toContain("test-subscription-token");
  });

  it("a cache hit costs nothing; the reservation is still the resolved prices", async () => {
    const { apiKey, accountId } = await account();
    const body = { q: "cached query", s: ["hackernews", "github"], w: "7d" };
    const first = await search(body, apiKey);
    expect(first.body.data["cost"]).toMatchObject({ reserved_credits: 0.001, charged_credits: 0.001 });
    const second = await search(body, apiKey);
    expect(second.status).toBe(200);
    expect((second.body.data["sources"] as any[]).map((s) => [s.id, s.status, s.cached, s.cost_credits])).toEqual([
      ["hackernews", "ok", true, 0],
      ["github", "ok", true, 0],
    ]);
    expect(second.body.data["cost"]).toMatchObject({ reserved_credits: 0.001, charged_credits: 0 });
    expect(second.body.data["results"]).toEqual(first.body.data["results"]);
    expect(await holdsOf(accountId)).toEqual([
      { reserved: 1000, charged: 1000, status: "settled", endpoint: "search" },
      { reserved: 1000, charged: 0, status: "settled", endpoint: "search" },
    ]);
    expect(await balanceUnits(database.db, accountId)).toBe(CREDITS - 1000);
    await assertInvariants(database.db, accountId);
  });

  it("partial failure: 200 with the others' results; only answered sources are charged", async () => {
    const { apiKey, accountId } = await account();
    fakes.providers.gdelt.reply({ hang: true });
    fakes.providers.exa.reply({ status: 500, body: { error: "boom" } });
    fakes.providers.brave.reply({ status: 429, headers: { "retry-after": "1" }, body: { type: "ErrorResponse" } });
    const { status, body } = await search({ q: "partial failure", s: ["brave", "exa", "stackoverflow", "gdelt"], w: "30d" }, apiKey);
    expect(status).toBe(200);
    expect((body.data["sources"] as any[]).map((s) => [s.id, s.status, s.cost_credits])).toEqual([
      ["brave", "rate_limited", 0],
      ["exa", "error", 0],
      ["stackoverflow", "ok", 0.0005],
      ["gdelt", "timeout", 0],
    ]);
    expect(body.data["cost"]).toMatchObject({ reserved_credits: 0.015, charged_credits: 0.0005 });
    expect(await balanceUnits(database.db, accountId)).toBe(CREDITS - 500);
    await assertInvariants(database.db, accountId);
  });

  it("no source answered → 502 with each source's status; nothing is charged", async () => {
    const { apiKey, accountId } = await account();
    fakes.providers.wikipedia.reply({ status: 503, body: "maintenance" });
    fakes.providers.arxiv.reply({ status: 500, body: "error" });
    const { status, body } = await search({ q: "nothing answers", s: ["wikipedia", "arxiv"] }, apiKey);
    expect(status).toBe(502);
    expect(body).toMatchObject({
      code: 50201,
      message: "no search source answered",
      data: { reason: "UPSTREAM_FAILED", metadata: { source_wikipedia: "error: upstream answered HTTP 503", source_arxiv: "error: upstream answered HTTP 500" } },
    });
    expect(await balanceUnits(database.db, accountId)).toBe(CREDITS);
    expect(await holdsOf(accountId)).toEqual([{ reserved: 1000, charged: 0, status: "released", endpoint: "search" }]);
    await assertInvariants(database.db, accountId);
  });

  it.each([
    ["an unknown id names the bad and the allowed ones", { q: "x", s: ["google"] }, "s", 'unknown source ids "google"; allowed: brave, exa, wikipedia, hackernews, stackoverflow, github, arxiv, gdelt'],
    ["a window no requested source can honour", { q: "x", s: ["wikipedia"], w: "24h" }, "w", "cannot filter by time"],
  ])("400 before any money: %s", async (_name, body, field, message) => {
    const { apiKey, accountId } = await account();
    const response = await search(body, apiKey);
    expect(response.status).toBe(400);
    expect(response.body.data["field"]).toBe(field);
    expect(response.body.message).toContain(message);
    expect(await holdsOf(accountId)).toEqual([]);
  });

  it("a balance below the reservation → 402, no upstream call", async () => {
    const { apiKey } = await account(999);
    const before = fakes.providers.hackernews.requests.length;
    const response = await search({ q: "too poor", s: ["hackernews", "github"] }, apiKey);
    expect(response.status).toBe(402);
    expect(fakes.providers.hackernews.requests.length).toBe(before);
  });

  it("an Idempotency-Key replays the settled answer without calling upstream again", async () => {
    const { apiKey, accountId } = await account();
    const headers = { "idempotency-key": "search-replay-1" };
    const first = await search({ q: "idempotent", s: ["stackoverflow"] }, apiKey, headers);
    const calls = fakes.providers.stackoverflow.requests.length;
    const again = await search({ q: "idempotent", s: ["stackoverflow"] }, apiKey, headers);
    expect(again.status).toBe(200);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(again.body.data["results"]).toEqual(first.body.data["results"]);
    expect(fakes.providers.stackoverflow.requests.length).toBe(calls);
    expect(await balanceUnits(database.db, accountId)).toBe(CREDITS - 500);
  });
});

describe("over gRPC and Connect", () => {
  it("Search and ListSources answer the same on every surface", async () => {
    const { apiKey } = await account();
    const headers = { authorization: `Bearer ${apiKey}` };
    for (const transport of [
      createConnectTransport({ baseUrl: service.url, httpVersion: "1.1" }),
      createGrpcTransport({ baseUrl: service.url }),
    ]) {
      const client = createClient(SearchService, transport);
      const answer = await client.search({ q: "grpc search", s: ["hackernews"] }, { headers });
      expect(answer.s).toEqual(["hackernews"]);
      expect(answer.w).toBe("any");
      expect(answer.results[0]!.url).toBe("https://bitbashing.io/async-rust.html");
      expect(answer.results[0]!.discussionUrl).toBe("https://news.ycombinator.com/item?id=38000001");
      expect(answer.cost).toMatchObject({ funding: "paid", reservedCredits: 0.0005 });
      const listed = await client.listSources({}, { headers });
      expect(listed.sources).toHaveLength(8);
    }
  });
});

describe("GET /api/v1/sources", () => {
  it("describes every source: kind, configured, window support, default flag, price", async () => {
    const { apiKey } = await account();
    const response = await fetch(`${service.url}/api/v1/sources`, { headers: { authorization: `Bearer ${apiKey}` } });
    expect(response.status).toBe(200);
    const body = (await response.json()) as { code: number; data: { sources: unknown[] } };
    expect(body.code).toBe(0);
    expect(body.data.sources).toEqual([
      { id: "brave", kind: "web", configured: true, supports_time_window: true, is_default: true, price_credits: 0.006 },
      { id: "exa", kind: "web", configured: true, supports_time_window: true, is_default: true, price_credits: 0.008 },
      { id: "wikipedia", kind: "reference", configured: true, supports_time_window: false, is_default: true, price_credits: 0.0005 },
      { id: "hackernews", kind: "forum", configured: true, supports_time_window: true, is_default: true, price_credits: 0.0005 },
      { id: "stackoverflow", kind: "forum", configured: true, supports_time_window: true, is_default: false, price_credits: 0.0005 },
      { id: "github", kind: "code", configured: true, supports_time_window: true, is_default: false, price_credits: 0.0005 },
      { id: "arxiv", kind: "papers", configured: true, supports_time_window: true, is_default: false, price_credits: 0.0005 },
      { id: "gdelt", kind: "news", configured: true, supports_time_window: true, is_default: true, price_credits: 0.0005 },
    ]);
  });

  it("requires an API key", async () => {
    const response = await fetch(`${service.url}/api/v1/sources`);
    expect(response.status).toBe(401);
  });
});

describe("nothing configured", () => {
  it("authenticates, then answers 503 without holding money", async () => {
    const bare = await startTestApp(database, { TYPESAFE_SEARCH_SOURCES: "none", TYPESAFE_SHUTDOWN_GRACE_MS: "200" });
    try {
      const { apiKey, accountId } = await account();
      const response = await postJson(`${bare.url}/api/v1/search`, { q: "anything" }, { apiKey });
      expect(response.status).toBe(503);
      expect(response.body).toMatchObject({ code: 50301, data: { reason: "NOT_CONFIGURED" } });
      expect(await holdsOf(accountId)).toEqual([]);
      const anonymous = await postJson(`${bare.url}/api/v1/search`, { q: "anything" }, { headers: { authorization: "Bearer ts_live_nope" } });
      expect(anonymous.status).toBe(401);
      const listed = await fetch(`${bare.url}/api/v1/sources`, { headers: { authorization: `Bearer ${apiKey}` } });
      const sources = ((await listed.json()) as { data: { sources: { configured: boolean }[] } }).data.sources;
      expect(sources.every((s) => !s.configured)).toBe(true);
    } finally {
      await bare.stop();
    }
  });
});
