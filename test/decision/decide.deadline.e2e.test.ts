import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { balanceUnits, createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { assertInvariants } from "../support/invariants.js";
import { deferred, logprobsReply, routeByMarker, startFakeLlm, type FakeLlm } from "../support/fake-llm.js";

let database: TestDatabase;
let fake: FakeLlm;
let service: TestApp;
let unconfigured: TestApp;
/** Holds the hanging replies open until the file is done. */
const hang = deferred();

beforeAll(async () => {
  database = await createTestDatabase();
  fake = await startFakeLlm();
  service = await startTestApp(database, {
    TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
    TYPESAFE_LLM_REQUEST_TIMEOUT_MS: "1000",
    TYPESAFE_LLM_CALL_TIMEOUT_MS: "5000",
    TYPESAFE_LLM_MAX_RETRIES: "0",
  });
  unconfigured = await startTestApp(database);
});
afterAll(async () => {
  hang.resolve();
  await service?.stop();
  await unconfigured?.stop();
  await fake?.close();
  await database?.close();
});

const request = {
  model: "typesafe/service-1.13",
  state: "The checkout page returns HTTP 500 for every customer since 09:00.",
  questions: {
    urgent: { type: "noul", instructions: "Is it urgent?" },
    outage: { type: "noul", instructions: "Is this an outage?" },
  },
};

describe("the request deadline", () => {
  it("answers what finished in time; a hanging question becomes a retryable timeout", async () => {
    fake.setHandler(
      routeByMarker({ "Is it urgent?": () => ({ hold: hang.promise }), "Is this an outage?": () => logprobsReply({ yes: 1 }, { prompt: 77 }) }),
    );
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const res = await postJson(`${service.url}/api/v1/decisions`, request, { apiKey });
    expect(res.status).toBe(200);
    expect(res.body.data.answers).toEqual({
      urgent: { type: "error", code: "timeout", message: "the upstream model did not answer within the deadline", retryable: true },
      outage: { type: "noul", noul: 1, x_label_mass: 1, x_method: "logprobs", x_unseen: 1, x_unseen_mass_max: 0 },
    });
    expect(res.body.data.usage).toMatchObject({ input_tokens: 77, upstream_calls: 1 });
    expect(await balanceUnits(database.db, accountId)).toBe(1_000_000 - 77);
    await assertInvariants(database.db, accountId);
  });

  it("answers 502 and releases the hold when every question hangs", async () => {
    fake.setHandler(routeByMarker({ "?": () => ({ hold: hang.promise }) }));
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const res = await postJson(`${service.url}/api/v1/decisions`, request, { apiKey });
    expect(res.status).toBe(502);
    expect(res.body.code).toBe(50201);
    expect(await balanceUnits(database.db, accountId)).toBe(1_000_000);
    await assertInvariants(database.db, accountId);
  });
});

describe("without TYPESAFE_LLM_BASE_URL", () => {
  it("answers 503 NOT_CONFIGURED after authenticating, and charges nothing", async () => {
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const res = await postJson(`${unconfigured.url}/api/v1/decisions`, request, { apiKey });
    expect(res.status).toBe(503);
    expect(res.body.code).toBe(50301);
    const bad = await postJson(`${unconfigured.url}/api/v1/decisions`, request, { apiKey: apiKey.slice(0, -4) + "AAAA" });
    expect(bad.status).toBe(401);
    expect(await balanceUnits(database.db, accountId)).toBe(1_000_000);
  });
});
