import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DecideRequestSchema, DecisionService } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { startFakeSearch, type FakeSearch } from "../support/fake-search/providers.js";

let database: TestDatabase;
let fake: FakeLlm;
let fakeSearch: FakeSearch;
let service: TestApp;

beforeAll(async () => {
  database = await createTestDatabase();
  fake = await startFakeLlm();
  fakeSearch = await startFakeSearch({ ids: ["hackernews"] });
  service = await startTestApp(database, { ...fakeSearch.env, TYPESAFE_LLM_BASE_URL: `${fake.url}/v1` });
});
afterAll(async () => {
  await service?.stop();
  await fake?.close();
  await fakeSearch?.close();
  await database?.close();
});

const decision = {
  model: "typesafe/service-1.13",
  state: "the checkout page returns 500",
  questions: { urgent: { type: "noul", instructions: "Is this urgent?" } },
};
const DECIDE = "/typesafe.decision.v1.DecisionService/Decide";

/** The value of one sample line of the Prometheus text format, or undefined when absent. */
function sample(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  const wanted = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  for (const line of text.split("\n")) {
    const match = /^([a-z_:]+)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!match || match[1] !== name) continue;
    const have = (match[2] ?? "").split(",").filter(Boolean);
    if (wanted.length === have.length && wanted.every((label) => have.includes(label))) return Number(match[3]);
  }
  return undefined;
}

describe("GET /metrics", () => {
  it("counts calls by procedure, protocol and reason with latencies, without a key and without revealing who called", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 1_000_000 });
    expect((await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey })).status).toBe(200);
    expect((await postJson(`${service.url}/api/v1/decisions`, decision, {})).status).toBe(401);
    const secretPath = `/no-such-path-${accountId}`;
    expect((await fetch(`${service.url}${secretPath}`)).status).toBe(404);
    const client = createClient(DecisionService, createConnectTransport({ baseUrl: service.url, httpVersion: "1.1" }));
    await client.decide(
      create(DecideRequestSchema, {
        model: decision.model,
        state: { kind: { case: "stringValue", value: decision.state } },
        questions: { urgent: { type: "noul", instructions: "Is this urgent?" } },
      }),
      { headers: { authorization: `Bearer ${apiKey}` } },
    );

    const response = await fetch(`${service.url}/metrics`);
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);
    const text = await response.text();

    expect(sample(text, "typesafe_calls_total", { procedure: DECIDE, protocol: "gateway", reason: "OK" })).toBe(1);
    expect(sample(text, "typesafe_calls_total", { procedure: DECIDE, protocol: "gateway", reason: "UNAUTHENTICATED" })).toBe(1);
    expect(sample(text, "typesafe_calls_total", { procedure: DECIDE, protocol: "connect", reason: "OK" })).toBe(1);
    expect(sample(text, "typesafe_calls_total", { procedure: "other", protocol: "gateway", reason: "NOT_FOUND" })).toBe(1);
    expect(sample(text, "typesafe_call_duration_seconds_count", { procedure: DECIDE, protocol: "gateway" })).toBe(2);
    const decideSeconds = sample(text, "typesafe_call_duration_seconds_sum", { procedure: DECIDE, protocol: "gateway" })!;
    expect(decideSeconds).toBeGreaterThan(0);
    expect(decideSeconds).toBeLessThan(30);

    expect(sample(text, "typesafe_meter_late_settles_total")).toBe(0);
    expect(sample(text, "typesafe_meter_holds_expired_total")).toBe(0);
    expect(sample(text, "typesafe_meter_admissions_abandoned_total")).toBe(0);
    expect(sample(text, "typesafe_db_pool_connections", { state: "pending" })).toBe(0);
    expect(sample(text, "typesafe_db_pool_connections", { state: "used" })).toEqual(expect.any(Number));
    expect(sample(text, "process_cpu_seconds_total")).toBeGreaterThan(0);

    expect(text).not.toContain(apiKey);
    expect(text).not.toContain(accountId);
    expect(text).not.toContain("checkout");
  });

  it("counts upstream LLM calls, tokens and answer methods, and search sources with cache hits", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    // The first decision of a process also probes the upstream; this one starts after that.
    expect((await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey })).status).toBe(200);
    const before = await (await fetch(`${service.url}/metrics`)).text();
    const decided = await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey });
    expect(decided.status).toBe(200);
    const usage = decided.body.data["usage"] as { input_tokens: number; output_tokens: number; cached_input_tokens: number };
    for (let i = 0; i < 2; i++) {
      expect((await postJson(`${service.url}/api/v1/search`, { q: "postgres vacuum", s: ["hackernews"] }, { apiKey })).status).toBe(200);
    }
    const after = await (await fetch(`${service.url}/metrics`)).text();
    const grew = (name: string, labels: Record<string, string> = {}) => (sample(after, name, labels) ?? 0) - (sample(before, name, labels) ?? 0);

    expect(usage.input_tokens).toBeGreaterThan(0);
    expect(grew("typesafe_llm_calls_total", { outcome: "ok" })).toBe(1);
    expect(grew("typesafe_llm_call_duration_seconds_count")).toBe(1);
    expect(grew("typesafe_llm_tokens_total", { kind: "input" })).toBe(usage.input_tokens);
    expect(grew("typesafe_llm_tokens_total", { kind: "output" })).toBe(usage.output_tokens);
    expect(grew("typesafe_llm_tokens_total", { kind: "cached_input" })).toBe(usage.cached_input_tokens);
    expect(grew("typesafe_decision_answers_total", { method: "logprobs" })).toBe(1);
    expect(grew("typesafe_search_source_results_total", { source: "hackernews", status: "ok" })).toBe(2);
    expect(grew("typesafe_search_cache_hits_total", { source: "hackernews" })).toBe(1);
    expect(grew("typesafe_search_source_duration_seconds_count", { source: "hackernews" })).toBe(2);
    expect(after).not.toContain("postgres vacuum");
  });

  it("counts settles and releases, shows holds in flight, and times database statements", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const before = await (await fetch(`${service.url}/metrics`)).text();
    expect((await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey })).status).toBe(200);
    // Algolia's shape for an error answer (hn.algolia.com/api: {"message", "status"}); the only source failing makes the call fail.
    fakeSearch.providers.hackernews.reply({ status: 503, body: { message: "Service Unavailable", status: 503 } });
    try {
      expect((await postJson(`${service.url}/api/v1/search`, { q: "released hold", s: ["hackernews"] }, { apiKey })).status).toBe(502);
    } finally {
      fakeSearch.reset();
    }
    const after = await (await fetch(`${service.url}/metrics`)).text();
    const grew = (name: string, labels: Record<string, string> = {}) => (sample(after, name, labels) ?? 0) - (sample(before, name, labels) ?? 0);

    expect(grew("typesafe_meter_settles_total")).toBe(1);
    expect(grew("typesafe_meter_releases_total")).toBe(1);
    expect(sample(after, "typesafe_meter_holds_in_flight")).toBe(0);
    // Admission and settle of the decision, admission and release of the search: at least four statements.
    expect(grew("typesafe_db_query_duration_seconds_count", { outcome: "ok" })).toBeGreaterThanOrEqual(4);
    expect(sample(after, "typesafe_db_query_duration_seconds_sum", { outcome: "ok" })).toBeGreaterThan(0);
  });

  it("TYPESAFE_METRICS=off: no /metrics (404), calls answered as before", async () => {
    const quiet = await startTestApp(database, { TYPESAFE_METRICS: "off" });
    try {
      expect((await fetch(`${quiet.url}/metrics`)).status).toBe(404);
      expect((await fetch(`${quiet.url}/healthz`)).status).toBe(200);
    } finally {
      await quiet.stop();
    }
  });

  it("answers only GET, with the enveloped 405", async () => {
    const response = await fetch(`${service.url}/metrics`, { method: "POST", body: "{}" });
    expect(response.status).toBe(405);
    expect(response.headers.get("allow")).toBe("GET");
    expect(await response.json()).toMatchObject({ data: { reason: "METHOD_NOT_ALLOWED" } });
  });
});
