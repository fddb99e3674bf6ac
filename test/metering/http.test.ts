import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { DecideRequestSchema, DecisionService } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { defaultHandler, deferred, startFakeLlm, type FakeHandler, type FakeLlm } from "../support/fake-llm.js";
import { answerQuestions, holdQuestions } from "../support/held-upstream.js";
import { assertInvariants } from "../support/invariants.js";
import { runAdmin } from "../support/process.js";
import { waitFor } from "../support/wait.js";

/**
 * Metering at the HTTP boundary: the real service, the real database and a
 * real OpenAI-compatible upstream that can hold calls open or fail them.
 * Every 1-question decision reserves 32,000 units; the fake upstream reports
 * 100 prompt tokens per call, so a successful call is charged 100 units.
 */
let database: TestDatabase;
let fake: FakeLlm;
let service: TestApp;

beforeAll(async () => {
  database = await createTestDatabase(10);
  fake = await startFakeLlm();
  service = await startTestApp(database, {
    TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
    TYPESAFE_LLM_MAX_RETRIES: "0",
    // Generous, so calls held open by a burst never time out on a busy machine; the
    // call-timeout test runs its own impatient service.
    TYPESAFE_LLM_CALL_TIMEOUT_MS: "10000",
    TYPESAFE_LLM_REQUEST_TIMEOUT_MS: "20000",
  });
});
afterEach(() => fake.setHandler(defaultHandler));
afterAll(async () => {
  await service?.stop();
  await fake?.close();
  await database?.close();
});

const decision = {
  model: "typesafe/service-1.13",
  state: "a support ticket: the checkout page returns 500 since this morning",
  questions: { urgent: { type: "noul", instructions: "Is this urgent?" } },
};
const decide = (apiKey: string, init: { signal?: AbortSignal; headers?: Record<string, string>; body?: unknown } = {}) =>
  postJson(`${service.url}/api/v1/decisions`, init.body ?? decision, { apiKey, ...init });
const accountRow = (accountId: string) => database.db("accounts").where({ id: accountId }).first();

/**
 * Holds every question call open, fires `count` concurrent calls, and waits
 * until each has either reached the upstream or been answered; then releases
 * the upstream and collects every answer.
 */
async function burst(apiKey: string, count: number) {
  const questionsBefore = fake.questionRequests().length;
  const reached = () => fake.questionRequests().length - questionsBefore;
  let answered = 0;
  const settledOrHeld = deferred();
  const check = () => {
    if (answered + reached() >= count) settledOrHeld.resolve();
  };
  const upstream = holdQuestions(fake, (request, index) => {
    queueMicrotask(check);
    return defaultHandler(request, index);
  });
  const calls = Array.from({ length: count }, () =>
    decide(apiKey).then((response) => {
      answered++;
      check();
      return response;
    }),
  );
  await settledOrHeld.promise;
  const reachedWhileHeld = reached();
  upstream.release();
  const responses = await Promise.all(calls);
  return { reachedWhileHeld, responses };
}

describe("concurrent calls over HTTP", () => {
  it("balance for exactly 3 reservations and 40 concurrent calls: 3 reach the upstream, 37 get 402", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 3 * 32_000 });
    const { reachedWhileHeld, responses } = await burst(apiKey, 40);
    expect(reachedWhileHeld).toBe(3);
    const statuses = responses.map((r) => r.status).sort();
    expect(statuses).toEqual([...Array(3).fill(200), ...Array(37).fill(402)]);
    const refused = responses.find((r) => r.status === 402)!;
    expect(refused.body).toMatchObject({ code: 40201, data: { reason: "INSUFFICIENT_BALANCE" } });
    expect(refused.body.data["metadata"]).toMatchObject({ required_credits: "0.032" });
    for (const ok of responses.filter((r) => r.status === 200)) {
      expect(ok.body.data["billing"]).toMatchObject({ funding: "paid", reserved_credits: 0.032, charged_credits: 0.0001 });
    }
    expect(await accountRow(accountId)).toMatchObject({ balance: 96_000 - 300, reserved: 0, in_flight: 0 });
    await assertInvariants(database.db, accountId);
  });

  it("a rich account with 40 concurrent calls: exactly 5 reach the upstream, 35 get the concurrency 429", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 100 * 32_000 });
    const { reachedWhileHeld, responses } = await burst(apiKey, 40);
    expect(reachedWhileHeld).toBe(5);
    const limited = responses.filter((r) => r.status === 429);
    expect(limited).toHaveLength(35);
    expect(limited[0]!.body).toMatchObject({ code: 42902, data: { reason: "CONCURRENCY_LIMITED", metadata: { limit: "concurrent_requests" } } });
    expect(limited[0]!.headers.get("retry-after")).toBe("1");
    expect((await accountRow(accountId)).recent).toHaveLength(5);
    await assertInvariants(database.db, accountId);
  });
});

describe("rate limit over HTTP", () => {
  it("60 calls in a minute pass with RateLimit headers counting down; the 61st is refused with Retry-After", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 100 * 32_000 });
    const remaining: string[] = [];
    for (let i = 0; i < 60; i++) {
      const response = await decide(apiKey);
      expect(response.status).toBe(200);
      remaining.push(response.headers.get("ratelimit-remaining") ?? "");
    }
    expect(remaining.slice(0, 3)).toEqual(["59", "58", "57"]);
    expect(remaining.at(-1)).toBe("0");
    const refused = await decide(apiKey);
    expect(refused.status).toBe(429);
    expect(refused.body).toMatchObject({ code: 42901, data: { reason: "RATE_LIMITED", metadata: { limit: "requests_per_minute" } } });
    const retryAfter = Number(refused.headers.get("retry-after"));
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(60);
    expect(refused.headers.get("ratelimit-remaining")).toBe("0");
    expect((await accountRow(accountId)).balance).toBe(100 * 32_000 - 60 * 100);
    await assertInvariants(database.db, accountId);
  });
});

describe("free requests over HTTP", () => {
  it("free first, then paid; a failed call gives its free request back", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 32_000, freeRequests: 1 });
    answerQuestions(fake, () => ({ status: 500, json: { error: { message: "boom" } } }));
    const failed = await decide(apiKey);
    expect(failed.status).toBe(502);
    fake.setHandler(defaultHandler);
    const first = await decide(apiKey);
    const second = await decide(apiKey);
    const third = await decide(apiKey);
    expect([first.body.data["billing"], second.body.data["billing"]]).toMatchObject([
      { funding: "free", charged_credits: 0, free_requests_remaining: 0 },
      { funding: "paid", charged_credits: 0.0001, balance_credits: 0.0319 },
    ]);
    expect(third.status).toBe(402);
    await assertInvariants(database.db, accountId);
  });
});

describe("upstream faults: 502 and nothing charged", () => {
  const faults: [string, FakeHandler][] = [
    ["HTTP 500", () => ({ status: 500, json: { error: { message: "internal", type: "server_error" } } })],
    ["a malformed body", () => ({ text: "{not json" })],
    ["a reset connection", () => ({ hold: Promise.reject(new Error("reset")) })],
  ];
  async function expectUpstreamFailureUncharged(url: string, fault: FakeHandler) {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 32_000 });
    answerQuestions(fake, fault);
    const response = await postJson(`${url}/api/v1/decisions`, decision, { apiKey });
    expect(response.status).toBe(502);
    expect(response.body).toMatchObject({ code: 50201, data: { reason: "UPSTREAM_FAILED" } });
    expect(JSON.stringify(response.body)).not.toMatch(/internal|not json|reset|boom/);
    expect(await accountRow(accountId)).toMatchObject({ balance: 32_000, reserved: 0, in_flight: 0 });
    await assertInvariants(database.db, accountId);
  }
  it.each(faults)("%s", (_name, fault) => expectUpstreamFailureUncharged(service.url, fault));

  it("no answer within the call timeout", async () => {
    const impatient = await startTestApp(database, {
      TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
      TYPESAFE_LLM_MAX_RETRIES: "0",
      TYPESAFE_LLM_CALL_TIMEOUT_MS: "300",
      TYPESAFE_LLM_REQUEST_TIMEOUT_MS: "2000",
      TYPESAFE_SHUTDOWN_GRACE_MS: "200",
    });
    try {
      await expectUpstreamFailureUncharged(impatient.url, () => ({ hold: new Promise(() => {}) }));
    } finally {
      await impatient.stop();
    }
  });

  it("a caller that goes away: the upstream call is aborted and the hold released", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 32_000 });
    const upstreamClosed = deferred();
    const upstream = holdQuestions(fake);
    fake.onRequestClosed = () => upstreamClosed.resolve();
    const caller = new AbortController();
    const call = decide(apiKey, { signal: caller.signal }).catch((err: unknown) => err);
    await upstream.reached;
    caller.abort();
    await call;
    await upstreamClosed.promise;
    upstream.release();
    await waitFor(async () => (await accountRow(accountId)).in_flight === 0, "the hold to be released");
    expect(await accountRow(accountId)).toMatchObject({ balance: 32_000, reserved: 0 });
    await assertInvariants(database.db, accountId);
  });
});

describe("idempotency over HTTP", () => {
  it("a retry with the same key replays the answer without a second charge; another body is a 422", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 100_000 });
    const headers = { "idempotency-key": "ticket-7781" };
    const first = await decide(apiKey, { headers });
    const upstreamCalls = fake.questionRequests().length;
    const again = await decide(apiKey, { headers });
    expect(again.status).toBe(200);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(again.body.data["answers"]).toEqual(first.body.data["answers"]);
    expect(again.body.data["billing"]).toMatchObject({ request_id: (first.body.data["billing"] as { request_id: string }).request_id });
    expect(fake.questionRequests().length).toBe(upstreamCalls);

    const other = await decide(apiKey, { headers, body: { ...decision, state: "another ticket" } });
    expect(other.status).toBe(422);
    expect(other.body).toMatchObject({ code: 42201, data: { reason: "IDEMPOTENCY_MISMATCH" } });
    expect((await accountRow(accountId)).balance).toBe(100_000 - 100);
    await assertInvariants(database.db, accountId);
  });

  it("a retry while the first is still in flight gets 409", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 100_000 });
    const upstream = holdQuestions(fake);
    const headers = { "idempotency-key": "slow-one" };
    const first = decide(apiKey, { headers });
    await upstream.reached;
    const retry = await decide(apiKey, { headers });
    upstream.release();
    expect(retry.status).toBe(409);
    expect(retry.body).toMatchObject({ code: 40901, data: { reason: "IDEMPOTENCY_IN_PROGRESS" } });
    expect((await first).status).toBe(200);
    await assertInvariants(database.db, accountId);
  });
});

describe("the gRPC surface is metered by the same code", () => {
  it("a gRPC Decide is admitted, settled and billed, and shares the account's limits with the gateway", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 100_000 });
    const client = createClient(DecisionService, createGrpcTransport({ baseUrl: service.url }));
    let rateRemaining: string | null = null;
    const response = await client.decide(create(DecideRequestSchema, {
      model: decision.model,
      state: { kind: { case: "stringValue", value: decision.state } },
      questions: { urgent: { type: "noul", instructions: "Is this urgent?" } },
    }), {
      headers: { authorization: `Bearer ${apiKey}` },
      onHeader: (headers) => (rateRemaining = headers.get("ratelimit-remaining")),
    });
    expect(response.billing).toMatchObject({ funding: "paid", reservedCredits: 0.032, chargedCredits: 0.0001, balanceCredits: 0.0999 });
    expect(rateRemaining).toBe("59");
    expect((await decide(apiKey)).headers.get("ratelimit-remaining")).toBe("58");
    await assertInvariants(database.db, accountId);
  });
});

describe("operator view of the money", () => {
  it("`usage` lists the charged calls and `accounts show` the balance, held credits and free requests", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 100_000, freeRequests: 1 });
    await decide(apiKey);
    await decide(apiKey);
    const env = { DATABASE_URL: database.url };
    const usage = JSON.parse((await runAdmin(["usage", "--account", accountId], env)).stdout);
    expect(usage.calls.map((c: { funding: string; charged_credits: number }) => [c.funding, c.charged_credits])).toEqual([
      ["paid", 0.0001],
      ["free", 0],
    ]);
    const shown = JSON.parse((await runAdmin(["accounts", "show", "--account", accountId], env)).stdout);
    expect(shown).toMatchObject({ balance_credits: 0.0999, held_credits: 0, free_requests_remaining: 0 });
  });
});
