import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NO_KEY_LIMITS, setKeyLimits, type KeyLimits } from "../../src/keys/key-limits.js";
import { createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { assertInvariants } from "../support/invariants.js";
import { callConnect, callGrpc } from "../support/wire.js";

/**
 * A key's own limits on every surface of the API: the JSON gateway, Connect
 * and gRPC answer an expired key, a missing scope, a key's rate limit and a
 * spent key budget with the same reason, status and metadata, and hold nothing.
 */
let database: TestDatabase;
let fake: FakeLlm;
let service: TestApp;
beforeAll(async () => {
  database = await createTestDatabase(6);
  fake = await startFakeLlm();
  service = await startTestApp(database, { TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_LLM_MAX_RETRIES: "0" });
});
afterAll(async () => {
  await service?.stop();
  await fake?.close();
  await database?.close();
});

const DECIDE = "/typesafe.decision.v1.DecisionService/Decide";
const body = JSON.stringify({
  model: "typesafe/service-1.13",
  state: "a support ticket",
  questions: { urgent: { type: "noul", instructions: "Is this urgent?" } },
});
/** gRPC status codes (grpc/doc/statuscodes.md). */
const GRPC = { ok: 0, failedPrecondition: 9, permissionDenied: 7, resourceExhausted: 8, unauthenticated: 16 };

async function keyWith(limits: Partial<KeyLimits>, units = 1_000_000) {
  const created = await createTestAccount(database.db, { units });
  await database.db.transaction((tx) => setKeyLimits(tx, created.accountId, created.keyId, { ...NO_KEY_LIMITS, ...limits }));
  return created;
}

/** One Decide on each surface with the same key, one after the other. */
async function onEverySurface(apiKey: string) {
  const gateway = await postJson(`${service.url}/api/v1/decisions`, body, { apiKey });
  const connect = await callConnect(service.url, DECIDE, body, { apiKey });
  const grpc = await callGrpc(service.url, DECIDE, new TextEncoder().encode(body), { apiKey, json: true });
  const data = gateway.body.data as { reason?: string; metadata?: Record<string, string> };
  return [
    { surface: "gateway", status: gateway.status, reason: data.reason, metadata: data.metadata },
    { surface: "connect", status: connect.status, reason: connect.reason, metadata: connect.metadata },
    { surface: "grpc", status: grpc.status, reason: grpc.reason, metadata: grpc.metadata },
  ];
}

describe("a key's limits answer the same on the gateway, Connect and gRPC", () => {
  it("an expired key: 401 KEY_EXPIRED with its expiry, not UNAUTHENTICATED", async () => {
    const expiresAt = new Date(Date.now() + 60_000);
    const { apiKey, keyId, accountId } = await keyWith({ expiresAt });
    await database.db("api_keys").where({ id: keyId }).update({ expires_at: new Date(Date.now() - 1) });
    const answers = await onEverySurface(apiKey);
    const expiredAt = (await database.db("api_keys").where({ id: keyId }).first()).expires_at.toISOString();
    const metadata = expect.objectContaining({ key_id: keyId, expired_at: expiredAt });
    expect(answers).toEqual([
      { surface: "gateway", status: 401, reason: "KEY_EXPIRED", metadata },
      { surface: "connect", status: 401, reason: "KEY_EXPIRED", metadata },
      { surface: "grpc", status: GRPC.unauthenticated, reason: "KEY_EXPIRED", metadata },
    ]);
    expect((await database.db("requests").where({ account_id: accountId })).length).toBe(0);
  });

  it("a key scoped to search calling Decide: 403 KEY_SCOPE_DENIED", async () => {
    const { apiKey, accountId } = await keyWith({ scopes: ["search"] });
    const answers = await onEverySurface(apiKey);
    expect(answers.map(({ status, reason }) => [status, reason])).toEqual([
      [403, "KEY_SCOPE_DENIED"],
      [403, "KEY_SCOPE_DENIED"],
      [GRPC.permissionDenied, "KEY_SCOPE_DENIED"],
    ]);
    expect((await database.db("requests").where({ account_id: accountId })).length).toBe(0);
  });

  it("a key with a budget below one call's hold: 402 KEY_BUDGET_EXCEEDED with the budget, spent and held in metadata", async () => {
    const { apiKey, accountId, keyId } = await keyWith({ budget: { units: 31_999, period: "day" } });
    const answers = await onEverySurface(apiKey);
    const metadata = expect.objectContaining({
      key_id: keyId,
      budget_period: "day",
      budget_credits: "0.031999",
      spent_credits: "0",
      held_credits: "0",
      left_credits: "0.031999",
      required_credits: "0.032",
    });
    expect(answers).toEqual([
      { surface: "gateway", status: 402, reason: "KEY_BUDGET_EXCEEDED", metadata },
      // The Connect protocol maps failed_precondition to HTTP 400 (connect-es: protocol-connect/http-status.ts), as for INSUFFICIENT_BALANCE.
      { surface: "connect", status: 400, reason: "KEY_BUDGET_EXCEEDED", metadata },
      { surface: "grpc", status: GRPC.failedPrecondition, reason: "KEY_BUDGET_EXCEEDED", metadata },
    ]);
    await assertInvariants(database.db, accountId);
  });

  it("a key limited to 2 calls a minute: the third is 429 RATE_LIMITED naming the key's limit, with Retry-After", async () => {
    const { apiKey, accountId } = await keyWith({ rateLimit: 2 });
    const answers = await onEverySurface(apiKey);
    expect(answers.map(({ status, reason }) => [status, reason ?? "OK"])).toEqual([
      [200, "OK"],
      [200, "OK"],
      [GRPC.resourceExhausted, "RATE_LIMITED"],
    ]);
    expect(answers[2]!.metadata).toMatchObject({ limit: "key_requests_per_minute", limit_value: "2" });
    const gateway = await postJson(`${service.url}/api/v1/decisions`, body, { apiKey });
    expect(gateway.status).toBe(429);
    expect(Number(gateway.headers.get("retry-after"))).toBeGreaterThan(0);
    expect(gateway.headers.get("ratelimit-limit")).toBe("2");
    await assertInvariants(database.db, accountId);
  });

  it("a key with a budget is charged what the call cost, and the answer is the account's usual billing", async () => {
    const { apiKey, accountId, keyId } = await keyWith({ budget: { units: 100_000, period: "month" }, scopes: ["decisions"] });
    const answer = await postJson(`${service.url}/api/v1/decisions`, body, { apiKey });
    expect(answer.status).toBe(200);
    const charged = Math.round(((answer.body.data as { billing: { charged_credits: number } }).billing.charged_credits) * 1_000_000);
    expect(charged).toBeGreaterThan(0);
    expect(await database.db("api_keys").where({ id: keyId }).first()).toMatchObject({ budget_spent: charged });
    await assertInvariants(database.db, accountId);
  });
});
