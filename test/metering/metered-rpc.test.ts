import { create, equals } from "@bufbuild/protobuf";
import { createContextValues, createHandlerContext, type HandlerContext } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config.js";
import { describeError } from "../../src/errors.js";
import { DecisionService } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { ListSourcesResponseSchema } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { createLogger } from "../../src/logger.js";
import { createMeter, type Meter } from "../../src/metering/meter.js";
import { meteredRpc, type MeteredRpcCall } from "../../src/metering/metered-rpc.js";
import { kCallPhases, type CallPhases } from "../../src/call/call-phases.js";
import { kRequestId } from "../../src/call/context.js";
import { unitsToCredits } from "../../src/units.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";

/**
 * meteredRpc: the one metered path of gRPC, Connect and the gateway, driven
 * with Connect's own handler context against the real meter and database.
 */
let database: TestDatabase;
let meter: Meter;

beforeAll(async () => {
  database = await createTestDatabase();
  meter = createMeter({ db: database.db, config: loadConfig({}).metering, logger: createLogger("silent") });
});
afterAll(async () => {
  await database?.close();
});

const answer = create(ListSourcesResponseSchema, { sources: [{ id: "hackernews", kind: "forum", configured: true, priceCredits: 0.25 }] });

function context(headers: Record<string, string> = {}): { ctx: HandlerContext; phases: CallPhases; requestId: string } {
  const phases: CallPhases = {};
  const requestId = crypto.randomUUID();
  const ctx = createHandlerContext({
    service: DecisionService,
    method: DecisionService.method.decide,
    protocolName: "connect",
    requestMethod: "POST",
    url: "http://localhost/typesafe.decision.v1.DecisionService/Decide",
    requestHeader: new Headers(headers),
    contextValues: createContextValues().set(kRequestId, requestId).set(kCallPhases, phases),
  });
  return { ctx, phases, requestId };
}

function rpcCall(apiKey: string, init: Partial<MeteredRpcCall<typeof ListSourcesResponseSchema>> = {}): MeteredRpcCall<typeof ListSourcesResponseSchema> {
  return { schema: ListSourcesResponseSchema, endpoint: "decide", apiKey, reserveUnits: 32_000, timeoutMs: 30_000, fingerprint: () => '{"q":1}', ...init };
}

describe("meteredRpc", () => {
  it("answers with the work's response and the billing, sets RateLimit headers, and bills under the call's request id", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 100_000 });
    const { ctx, requestId } = context();
    const result = await meteredRpc(meter, ctx, rpcCall(apiKey), async () => ({ response: answer, chargeUnits: 1_234 }));
    expect(equals(ListSourcesResponseSchema, result.response, answer)).toBe(true);
    expect(result.billing).toEqual({
      funding: "paid",
      reservedCredits: unitsToCredits(32_000),
      chargedCredits: unitsToCredits(1_234),
      balanceCredits: unitsToCredits(100_000 - 1_234),
      freeRequestsRemaining: 0,
      requestId,
    });
    expect(Object.fromEntries(ctx.responseHeader)).toEqual({ "ratelimit-limit": "60", "ratelimit-remaining": "59", "ratelimit-reset": "60" });
  });

  it("a decision uses a free request; a search never does", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 100_000, freeRequests: 2 });
    const decided = await meteredRpc(meter, context().ctx, rpcCall(apiKey), async () => ({ response: answer, chargeUnits: 500 }));
    expect(decided.billing).toMatchObject({ funding: "free", chargedCredits: 0, freeRequestsRemaining: 1 });
    const searched = await meteredRpc(meter, context().ctx, rpcCall(apiKey, { endpoint: "search", reserveUnits: 900 }), async () => ({ response: answer, chargeUnits: 500 }));
    expect(searched.billing).toMatchObject({ funding: "paid", chargedCredits: unitsToCredits(500), freeRequestsRemaining: 1 });
  });

  it("records where the time went: admission, the work, the settle, each within the call's wall time", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 100_000 });
    const { ctx, phases } = context();
    const started = performance.now();
    let workMs = 0;
    await meteredRpc(meter, ctx, rpcCall(apiKey), async () => {
      const workStarted = performance.now();
      await new Promise((resolve) => setImmediate(resolve));
      workMs = performance.now() - workStarted;
      return { response: answer, chargeUnits: 0 };
    });
    const wallMs = performance.now() - started;
    const { admitMs, upstreamMs, finishMs } = phases;
    for (const phase of [admitMs, upstreamMs, finishMs]) {
      expect(phase).toBeGreaterThan(0);
      expect(phase).toBeLessThan(wallMs);
    }
    expect(upstreamMs).toBeGreaterThanOrEqual(workMs);
    expect(admitMs! + upstreamMs! + finishMs!).toBeLessThanOrEqual(wallMs + 0.001);
  });

  it("a refused call records no work and no settle", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 0 });
    const { ctx, phases } = context();
    const failure = await meteredRpc(meter, ctx, rpcCall(apiKey), async () => ({ response: answer, chargeUnits: 0 })).catch(describeError);
    expect(failure).toMatchObject({ reason: "INSUFFICIENT_BALANCE" });
    expect(phases).toEqual({});
  });

  it("with an Idempotency-Key a retry returns the stored response, marked as replayed, without running the work", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 100_000 });
    const headers = { "idempotency-key": "order-1" };
    const first = await meteredRpc(meter, context(headers).ctx, rpcCall(apiKey), async () => ({ response: answer, chargeUnits: 700 }));
    const { ctx } = context(headers);
    let ran = false;
    const again = await meteredRpc(meter, ctx, rpcCall(apiKey), async () => {
      ran = true;
      return { response: create(ListSourcesResponseSchema), chargeUnits: 700 };
    });
    expect(ran).toBe(false);
    expect(equals(ListSourcesResponseSchema, again.response, answer)).toBe(true);
    expect(again.billing).toEqual(first.billing);
    expect(ctx.responseHeader.get("idempotent-replayed")).toBe("true");
    expect(ctx.responseHeader.get("ratelimit-limit")).toBe("60");
    // Only the call with a key stored its answer.
    await meteredRpc(meter, context().ctx, rpcCall(apiKey), async () => ({ response: answer, chargeUnits: 0 }));
    const stored = (await database.db("requests").where({ account_id: accountId }).orderBy("created_at")) as { response: unknown; idempotency_key: string | null }[];
    expect(stored.map((row) => [row.idempotency_key, row.response])).toEqual([
      ["order-1", { sources: [{ id: "hackernews", kind: "forum", configured: true, priceCredits: 0.25 }] }],
      [null, null],
    ]);
  });

  it("the same key with another request is a 422: the fingerprint goes with the key", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 100_000 });
    const headers = { "idempotency-key": "order-2" };
    await meteredRpc(meter, context(headers).ctx, rpcCall(apiKey), async () => ({ response: answer, chargeUnits: 0 }));
    const failure = await meteredRpc(meter, context(headers).ctx, rpcCall(apiKey, { fingerprint: () => '{"q":2}' }), async () => ({ response: answer, chargeUnits: 0 })).catch(describeError);
    expect(failure).toMatchObject({ reason: "IDEMPOTENCY_MISMATCH" });
  });

  it("a stored response with a field this version does not know still replays (written by a newer replica)", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 100_000 });
    const headers = { "idempotency-key": "order-4" };
    await meteredRpc(meter, context(headers).ctx, rpcCall(apiKey), async () => ({ response: answer, chargeUnits: 0 }));
    await database.db("requests").where({ account_id: accountId }).update({ response: JSON.stringify({ sources: [{ id: "hackernews" }], addedLater: true }) });
    const again = await meteredRpc(meter, context(headers).ctx, rpcCall(apiKey), async () => ({ response: answer, chargeUnits: 0 }));
    expect(again.response.sources.map((s) => s.id)).toEqual(["hackernews"]);
  });

  it("a stored response that no longer decodes is INTERNAL, not a wrong answer", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 100_000 });
    const headers = { "idempotency-key": "order-3" };
    await meteredRpc(meter, context(headers).ctx, rpcCall(apiKey), async () => ({ response: answer, chargeUnits: 0 }));
    await database.db("requests").where({ account_id: accountId }).update({ response: JSON.stringify({ sources: "not a list" }) });
    const thrown = await meteredRpc(meter, context(headers).ctx, rpcCall(apiKey), async () => ({ response: answer, chargeUnits: 0 })).catch((err: unknown) => err);
    expect(describeError(thrown)).toMatchObject({ reason: "INTERNAL", message: "internal error" });
    expect((thrown as Error).cause).toBeInstanceOf(Error);
  });
});
