import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { SearchService } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { startFakeSearch, type FakeSearch } from "../support/fake-search/providers.js";

/**
 * The filters through the real app: the JSON gateway's field names and the
 * per-source report, typed 400s naming the field, the entry and the rule on
 * every surface before any money moves, and the operator's safe-search floor.
 */

let database: TestDatabase;
let fakes: FakeSearch;
let service: TestApp;

beforeAll(async () => {
  database = await createTestDatabase();
  fakes = await startFakeSearch();
  service = await startTestApp(database, { ...fakes.env, TYPESAFE_SEARCH_MIN_SAFE: "moderate" });
});
afterAll(async () => {
  await service?.stop();
  await fakes?.close();
  await database?.close();
});
beforeEach(() => fakes.reset());

const search = (body: unknown, apiKey: string) => postJson(`${service.url}/api/v1/search`, body, { apiKey });
const holds = async (accountId: string) => database.db("requests").where({ account_id: accountId }).count<{ count: string }[]>("* as count");

describe("POST /api/v1/search with filters", () => {
  it("d, xd, l, c, safe in; each source's filters out, with what was dropped", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const { status, body } = await search({ q: "rust async", s: ["brave", "github", "hackernews"], d: ["tokio.rs", "bitbashing.io"], xd: ["example.com"], l: "en", safe: "strict" }, apiKey);
    expect(status).toBe(200);
    const data = body.data as Record<string, any>;
    const brave = fakes.providers.brave.requests[0]!;
    expect([brave.query.get("q"), brave.query.get("search_lang"), brave.query.get("safesearch"), brave.query.get("count")]).toEqual(["rust async -site:example.com", "en", "strict", "20"]);
    expect(data["sources"]).toEqual([
      {
        id: "brave", status: "ok", reason: "", result_count: 1, latency_ms: expect.any(Number), cached: false, cost_credits: 0.006,
        filters: {
          d: { applied: "post_filtered", dropped: 1 },
          xd: { applied: "native", dropped: 0 },
          l: { applied: "native", dropped: 0 },
          safe: { applied: "native", dropped: 0 },
        },
      },
      {
        id: "hackernews", status: "ok", reason: "", result_count: 1, latency_ms: expect.any(Number), cached: false, cost_credits: 0.0005,
        filters: {
          d: { applied: "post_filtered", dropped: 1 },
          xd: { applied: "post_filtered", dropped: 0 },
          l: { applied: "unsupported", dropped: 0 },
          safe: { applied: "unsupported", dropped: 0 },
        },
      },
      {
        id: "github", status: "filtered_out", reason: "d does not include github.com, the only site this source searches", result_count: 0, latency_ms: expect.any(Number), cached: false, cost_credits: 0,
        filters: {
          d: { applied: "native", dropped: 0 },
          xd: { applied: "native", dropped: 0 },
          l: { applied: "unsupported", dropped: 0 },
          safe: { applied: "unsupported", dropped: 0 },
        },
      },
    ]);
    expect(data["results"].map((r: any) => new URL(r.url).hostname).sort()).toEqual(["bitbashing.io", "tokio.rs"]);
    expect(fakes.providers.github.requests).toHaveLength(0);
    // Reserved for brave and hackernews only; github could never be charged.
    expect(data["cost"]).toMatchObject({ reserved_credits: 0.0065, charged_credits: 0.0065 });
  });

  it("the operator's floor: an omitted safe is moderate, reported for every source", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const { body } = await search({ q: "rust async", s: ["brave"] }, apiKey);
    expect(fakes.providers.brave.requests[0]!.query.get("safesearch")).toBe("moderate");
    expect((body.data as any)["sources"][0].filters).toEqual({ safe: { applied: "native", dropped: 0 } });
  });

  it.each([
    [{ d: ["co.uk"] }, "d[0]", '"co.uk" is a public suffix'],
    [{ xd: ["ok.example", "https://example.com/x"] }, "xd[1]", '"https://example.com/x" must be a domain name, not a URL'],
    [{ d: ["example.com:443"] }, "d[0]", "without a port"],
    [{ d: ["a.*.example.com"] }, "d[0]", 'wildcard only as a leading "*."'],
    [{ d: ["example.com"], xd: ["example.com"] }, "xd[0]", "is also in d"],
    [{ l: "english" }, "l", "ISO 639-1"],
    [{ c: "uk" }, "c", "ISO 3166-1 alpha-2"],
    [{ safe: "off" }, "safe", 'must be at least "moderate" on this deployment'],
    [{ s: ["github"], xd: ["github.com"] }, "xd", "the filters leave nothing to search"],
    [{ d: "example.com" }, "d", "must be an array"],
  ])("400 before any money: %j", async (filters, field, message) => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 1_000_000 });
    const response = await search({ q: "rust async", ...filters }, apiKey);
    expect(response.status).toBe(400);
    expect(response.body.data["field"]).toBe(field);
    expect(response.body.message).toContain(message);
    expect(Number((await holds(accountId))[0]!.count)).toBe(0);
    expect(fakes.requests()).toHaveLength(0);
  });
});

describe("every surface", () => {
  it("Connect, gRPC and gRPC-Web take the filters and refuse the same bad entry", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const headers = { authorization: `Bearer ${apiKey}` };
    for (const transport of [
      createConnectTransport({ baseUrl: service.url, httpVersion: "1.1" }),
      createGrpcTransport({ baseUrl: service.url }),
      createGrpcWebTransport({ baseUrl: service.url, httpVersion: "1.1" }),
    ]) {
      const client = createClient(SearchService, transport);
      fakes.reset();
      const answer = await client.search({ q: "grpc search", s: ["hackernews"], xd: ["bitbashing.io"], safe: "strict" }, { headers });
      expect(answer.results.map((r) => r.url)).toEqual(["https://news.ycombinator.com/item?id=38000002"]);
      expect(answer.sources[0]!.filters).toMatchObject({ xd: { applied: "post_filtered", dropped: 1 }, safe: { applied: "unsupported", dropped: 0 } });
      const refused = await client.search({ q: "grpc search", s: ["hackernews"], d: ["com"] }, { headers }).catch((err: unknown) => err);
      expect(refused).toBeInstanceOf(ConnectError);
      expect((refused as ConnectError).code).toBe(Code.InvalidArgument);
      expect((refused as ConnectError).rawMessage).toBe('d[0]: "com" is a public suffix ("com"), which names no site: give a domain under it');
    }
  });
});
