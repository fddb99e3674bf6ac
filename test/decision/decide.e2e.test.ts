import * as grpc from "@grpc/grpc-js";
import { fromBinary, fromJson, toBinary, toJson, type DescMessage, type JsonValue, type MessageShape } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  DecideRequestSchema,
  DecideResponseSchema,
  type DecideResponse,
} from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { balanceUnits, createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { assertInvariants } from "../support/invariants.js";
import { deferred, logprobsReply, routeByMarker, startFakeLlm, userContent, type FakeLlm } from "../support/fake-llm.js";
import { PROMPT_VERSION } from "../../src/decision/prompt.js";

let database: TestDatabase;
let fake: FakeLlm;
let service: TestApp;

beforeAll(async () => {
  database = await createTestDatabase();
  fake = await startFakeLlm();
  service = await startTestApp(database, {
    TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
    TYPESAFE_LLM_MODEL: "fake-model",
    TYPESAFE_LLM_MAX_RETRIES: "1",
  });
});
afterAll(async () => {
  await service?.stop();
  await fake?.close();
  await database?.close();
});

const request = {
  model: "typesafe/service-1.13",
  state: { ticket: "I was charged twice for my pro plan", customer: "c-42" },
  questions: {
    urgent: { type: "noul", instructions: "Is it urgent?" },
    team: { type: "choice", instructions: "Which team?", criteria: { billing: null, technical: null, sales: null } },
    impact: { type: "score", instructions: "How big is the impact?", criteria: ["none", "low", "high"] },
  },
};

const happyRoutes = {
  "Is it urgent?": () => logprobsReply({ yes: 0.5, " Yes": 0.2, no: 0.2, Maybe: 0.1 }, { prompt: 1_000, cached: 0 }),
  "Which team?": () => logprobsReply({ A: 0.7, " A": 0.1, B: 0.1, a: 0.1 }, { prompt: 1_100, cached: 900 }),
  "How big": () => logprobsReply({ "0": 0.1, "1": 0.3, "2": 0.5, "3": 0.1 }, { prompt: 1_200, cached: 900 }),
};

const expectedAnswers = {
  urgent: { type: "noul", noul: 0.777778, x_label_mass: 0.9, x_method: "logprobs" },
  team: {
    type: "choice",
    choice: "billing",
    probabilities: { billing: 0.888889, technical: 0.111111, sales: 0 },
    confidence: 0.833333,
    x_label_mass: 0.9,
    x_method: "logprobs",
    x_unseen: 1,
    x_unseen_mass_max: 0,
  },
  impact: {
    type: "score",
    score: 1.444444,
    legend: { "0": "none", "1": "low", "2": "high" },
    probabilities: { "0": 0.111111, "1": 0.333333, "2": 0.555556 },
    confidence: 0.166667,
    x_label: "high",
    x_index: 2,
    x_label_mass: 0.9,
    x_method: "logprobs",
  },
};

describe("POST /api/v1/decisions", () => {
  it("answers every type, reports usage and charges the input tokens", async () => {
    fake.setHandler(routeByMarker(happyRoutes));
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const res = await postJson(`${service.url}/api/v1/decisions`, request, { apiKey });
    expect(res.status).toBe(200);
    expect(res.body.code).toBe(0);
    expect(res.body.message).toBe("ok");
    const data = res.body.data;
    expect(data.model).toBe("typesafe/service-1.13");
    expect(data.prompt_version).toBe(PROMPT_VERSION);
    expect(data.answers).toEqual(expectedAnswers);
    expect(Object.keys(data.answers as object)).toEqual(["urgent", "team", "impact"]);
    expect(data.usage).toEqual({ input_tokens: 3_300, output_tokens: 3, cached_input_tokens: 1_800, upstream_calls: 3 });
    expect(data.billing).toMatchObject({
      funding: "paid",
      reserved_credits: 0.096,
      charged_credits: 0.0033,
      balance_credits: 0.9967,
      request_id: res.headers.get("x-request-id"),
    });
    expect(await balanceUnits(database.db, accountId)).toBe(1_000_000 - 3_300);
    await assertInvariants(database.db, accountId);
  });

  it("uses a free request first", async () => {
    fake.setHandler(routeByMarker(happyRoutes));
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 0, freeRequests: 1 });
    const res = await postJson(`${service.url}/api/v1/decisions`, request, { apiKey });
    expect(res.status).toBe(200);
    expect(res.body.data.billing).toMatchObject({ funding: "free", free_requests_remaining: 0 });
    await assertInvariants(database.db, accountId);
  });

  it("answers the other questions when one fails, and bills only the answered ones", async () => {
    fake.setHandler(routeByMarker({ ...happyRoutes, "Is it urgent?": () => ({ status: 503, text: "overloaded sk-secret" }) }));
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const res = await postJson(`${service.url}/api/v1/decisions`, request, { apiKey });
    expect(res.status).toBe(200);
    const answers = res.body.data.answers as Record<string, unknown>;
    expect(answers.urgent).toEqual({
      type: "error",
      code: "upstream_error",
      message: "the upstream model failed to answer this question",
      retryable: true,
    });
    expect(answers.team).toEqual(expectedAnswers.team);
    expect(res.body.data.usage).toMatchObject({ input_tokens: 2_300, upstream_calls: 2 });
    expect(JSON.stringify(res.body)).not.toMatch(/secret|overloaded/);
    expect(await balanceUnits(database.db, accountId)).toBe(1_000_000 - 2_300);
    await assertInvariants(database.db, accountId);
  });

  it("answers 502 when no question could be answered, and charges nothing", async () => {
    fake.setHandler(routeByMarker({ "?": () => ({ status: 500, text: "internal upstream detail" }) }));
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const res = await postJson(`${service.url}/api/v1/decisions`, request, { apiKey });
    expect(res.status).toBe(502);
    expect(res.body.code).toBe(50201);
    expect(res.body.message).not.toMatch(/detail/);
    expect(await balanceUnits(database.db, accountId)).toBe(1_000_000);
    await assertInvariants(database.db, accountId);
  });

  it("refuses a question whose prompt alone exceeds 32K tokens with a 400, before reserving or calling", async () => {
    // 32,100 CJK characters: 96.3 KB, inside the body limit, about a token each.
    fake.setHandler(routeByMarker(happyRoutes));
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const before = fake.requests.length;
    const res = await postJson(`${service.url}/api/v1/decisions`, { ...request, state: "日".repeat(32_100) }, { apiKey });
    expect(res.status).toBe(400);
    expect(res.body.message).toMatch(/^questions\.urgent: its prompt \(state included\) is about \d+ tokens, above 32000$/);
    expect(fake.requests.length).toBe(before);
    expect(await balanceUnits(database.db, accountId)).toBe(1_000_000);
    await assertInvariants(database.db, accountId);
  });

  it('orders integer-like option names first, ascending ("2" before "10"), then the others as given', async () => {
    fake.setHandler(routeByMarker({ "Which size?": () => logprobsReply({ A: 0.1, B: 0.2, C: 0.3, D: 0.4 }) }));
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const body =
      '{"model":"typesafe/service-1.13","state":"a shoe order",' +
      '"questions":{"size":{"type":"choice","instructions":"Which size?","criteria":{"small":null,"10":null,"large":null,"2":null}}}}';
    const res = await fetch(`${service.url}/api/v1/decisions`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
      body,
    });
    const text = await res.text();
    expect(res.status).toBe(200);
    const sent = userContent(fake.questionRequests().at(-1)!);
    expect(sent).toContain("Options:\nA: 2\nB: 10\nC: small\nD: large\n");
    expect(text).toContain('"probabilities":{"2":0.1,"10":0.2,"small":0.3,"large":0.4}');
    expect(JSON.parse(text).data.answers.size.choice).toBe("large");
  });
});

describe("Idempotency-Key", () => {
  it("replays the stored answers without calling the upstream or charging again", async () => {
    fake.setHandler(routeByMarker(happyRoutes));
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const headers = { "idempotency-key": `decide-${accountId}` };
    const first = await postJson(`${service.url}/api/v1/decisions`, request, { apiKey, headers });
    const calls = fake.requests.length;
    const again = await postJson(`${service.url}/api/v1/decisions`, request, { apiKey, headers });
    expect(again.status).toBe(200);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(again.body.data.answers).toEqual(first.body.data.answers);
    expect(again.body.data.usage).toEqual(first.body.data.usage);
    expect(fake.requests.length).toBe(calls);
    expect(await balanceUnits(database.db, accountId)).toBe(1_000_000 - 3_300);
    const other = await postJson(`${service.url}/api/v1/decisions`, { ...request, state: "another state" }, { apiKey, headers });
    expect(other.status).toBe(422);
    await assertInvariants(database.db, accountId);
  });
});

describe("cancellation", () => {
  it("cancels the upstream calls when the caller goes away", { timeout: 5_000 }, async () => {
    const hold = deferred();
    fake.setHandler(routeByMarker({ "?": () => ({ hold: hold.promise }) }));
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const before = fake.requests.length;
    const caller = new AbortController();
    const call = postJson(`${service.url}/api/v1/decisions`, request, { apiKey, signal: caller.signal }).catch((e: unknown) => e);
    await fake.received(before + 3);
    caller.abort();
    await Promise.all(fake.requests.slice(before).map((r) => r.cancelled));
    expect(await call).toBeInstanceOf(Error);
    hold.resolve();
  });
});

describe("gRPC", () => {
  function grpcJsDecide(port: number, key: string, message: MessageShape<typeof DecideRequestSchema>): Promise<DecideResponse> {
    const codec = <D extends DescMessage>(schema: D) => ({
      serialize: (m: MessageShape<D>) => Buffer.from(toBinary(schema, m)),
      deserialize: (bytes: Buffer) => fromBinary(schema, bytes),
    });
    const Client = grpc.makeGenericClientConstructor(
      {
        Decide: {
          path: "/typesafe.decision.v1.DecisionService/Decide",
          requestStream: false,
          responseStream: false,
          requestSerialize: codec(DecideRequestSchema).serialize,
          requestDeserialize: codec(DecideRequestSchema).deserialize,
          responseSerialize: codec(DecideResponseSchema).serialize,
          responseDeserialize: codec(DecideResponseSchema).deserialize,
        },
      },
      "DecisionService",
    );
    const client = new Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
    const metadata = new grpc.Metadata();
    metadata.set("authorization", `Bearer ${key}`);
    return new Promise((resolve, reject) => {
      (client as unknown as Record<string, Function>)["Decide"]!(message, metadata, (err: grpc.ServiceError | null, res: DecideResponse) => {
        client.close();
        if (err) reject(err);
        else resolve(res);
      });
    });
  }

  it("gives the same answers and usage as the gateway", async () => {
    fake.setHandler(routeByMarker(happyRoutes));
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const response = await grpcJsDecide(service.app.server.port, apiKey, fromJson(DecideRequestSchema, request as unknown as JsonValue));
    const json = toJson(DecideResponseSchema, response, { useProtoFieldName: true }) as Record<string, unknown>;
    expect(json.answers).toEqual(expectedAnswers);
    expect(json.usage).toEqual({ input_tokens: 3_300, output_tokens: 3, cached_input_tokens: 1_800, upstream_calls: 3 });
    expect(json.billing).toMatchObject({ funding: "paid", charged_credits: 0.0033 });
    await assertInvariants(database.db, accountId);
  });
});
