import net from "node:net";
import { fromJson } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestAccount, postJson, startTestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { holdQuestions } from "../support/held-upstream.js";
import { assertInvariants } from "../support/invariants.js";
import { DecideRequestSchema, DecisionService } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";

/**
 * Graceful shutdown: calls that finish within the grace period are answered
 * and billed; calls still running when it ends are cut off with a 503 and
 * their holds released; nothing new is admitted while draining.
 */
let database: TestDatabase;
let fake: FakeLlm;
beforeAll(async () => {
  database = await createTestDatabase();
  fake = await startFakeLlm();
});
afterAll(async () => {
  await fake?.close();
  await database?.close();
});

const decision = {
  model: "typesafe/service-1.13",
  state: "a deploy is stuck at 90%",
  questions: { rollback: { type: "noul", instructions: "Should we roll back?" } },
};
const accountRow = (accountId: string) => database.db("accounts").where({ id: accountId }).first();

/** A service (300 ms grace) with one decision call held at the upstream. */
async function serviceWithHeldCall(units: number) {
  const service = await startTestApp(database, { TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_SHUTDOWN_GRACE_MS: "300" });
  const { apiKey, accountId } = await createTestAccount(database.db, { units });
  const upstream = holdQuestions(fake);
  const call = postJson(`${service.url}/api/v1/decisions`, decision, { apiKey });
  await upstream.reached;
  return { service, apiKey, accountId, upstream, call };
}

describe("graceful shutdown", () => {
  it("a call still running when the grace period ends gets a 503 envelope and its hold back", async () => {
    const { service, accountId, upstream, call } = await serviceWithHeldCall(32_000);
    await service.stop();
    const response = await call;
    upstream.release();
    expect(response.status).toBe(503);
    expect(response.body).toMatchObject({ code: 50302, data: { reason: "UNAVAILABLE" } });
    expect(await accountRow(accountId)).toMatchObject({ balance: 32_000, reserved: 0, in_flight: 0 });
    await assertInvariants(database.db, accountId);
  });

  it("a gRPC call still running when the grace period ends gets UNAVAILABLE and its hold back", async () => {
    const service = await startTestApp(database, { TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_SHUTDOWN_GRACE_MS: "300" });
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 32_000 });
    const upstream = holdQuestions(fake);
    const client = createClient(DecisionService, createGrpcTransport({ baseUrl: service.url }));
    const call = client
      .decide(fromJson(DecideRequestSchema, decision), { headers: { authorization: `Bearer ${apiKey}` } })
      .catch((err: unknown) => ConnectError.from(err));
    await upstream.reached;
    await service.stop();
    const answer = await call;
    upstream.release();
    expect(answer).toBeInstanceOf(ConnectError);
    expect((answer as ConnectError).code).toBe(Code.Unavailable);
    expect((answer as ConnectError).rawMessage).toContain("shutting down");
    expect(await accountRow(accountId)).toMatchObject({ balance: 32_000, reserved: 0, in_flight: 0 });
    await assertInvariants(database.db, accountId);
  });

  it("a call that finishes within the grace period is answered and billed", async () => {
    const { service, accountId, upstream, call } = await serviceWithHeldCall(32_000);
    const stopped = service.stop();
    upstream.release();
    const [response] = await Promise.all([call, stopped]);
    expect(response.status).toBe(200);
    expect(await accountRow(accountId)).toMatchObject({ balance: 32_000 - 100, reserved: 0, in_flight: 0 });
    await assertInvariants(database.db, accountId);
  });

  it("while draining, a new call on a kept-alive connection is refused with 503 and not charged", async () => {
    const { service, apiKey, accountId, upstream, call: first } = await serviceWithHeldCall(64_000);
    const stopped = service.stop();
    const late = await service.app.meter
      .run(
        { apiKey, requestId: crypto.randomUUID(), endpoint: "decide", reserveUnits: 32_000, freeAllowed: false, timeoutMs: 1_000, signal: new AbortController().signal },
        async () => ({ value: null, chargeUnits: 1 }),
      )
      .catch((err: unknown) => err);
    upstream.release();
    await Promise.all([first, stopped]);
    expect(String(late)).toContain("shutting down");
    expect((await accountRow(accountId)).recent).toHaveLength(1);
    await assertInvariants(database.db, accountId);
  });

  it("connections that never sent a request do not hold up a stop (grace 60 s, test limit 30 s)", async () => {
    const service = await startTestApp(database, { TYPESAFE_SHUTDOWN_GRACE_MS: "60000" });
    const silent = net.connect(service.app.server.port, "127.0.0.1");
    const halfPreface = net.connect(service.app.server.port, "127.0.0.1", () => halfPreface.write("PR"));
    for (const socket of [silent, halfPreface]) socket.on("error", () => {}); // the server resets them
    await Promise.all([silent, halfPreface].map((socket) => new Promise((resolve) => socket.once("connect", resolve))));
    const closedByServer = Promise.all([silent, halfPreface].map((socket) => new Promise((resolve) => socket.once("close", resolve))));
    await service.stop();
    await closedByServer;
  });
});
