import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PROMPT_VERSION } from "../../src/decision/prompt.js";
import { DecideRequestSchema, DecisionService } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { defaultHandler, isProbe, startFakeLlm, type FakeLlm } from "../support/fake-llm.js";

/** The fake upstream answers every question this late: the upstream phase must account for it. */
const UPSTREAM_DELAY_MS = 150;

let database: TestDatabase;
let fake: FakeLlm;
let service: TestApp;
const logLines: Record<string, unknown>[] = [];

beforeAll(async () => {
  database = await createTestDatabase();
  // The delay is the quantity measured, not a synchronization: the test waits for the answer.
  fake = await startFakeLlm((request, index) => {
    const reply = defaultHandler(request, index);
    return isProbe(request.body) ? reply : { ...reply, delayMs: UPSTREAM_DELAY_MS };
  });
  service = await startTestApp(
    database,
    { TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_LOG_LEVEL: "info" },
    { onLogLine: (line) => logLines.push(JSON.parse(line)) },
  );
});
afterAll(async () => {
  await service?.stop();
  await fake?.close();
  await database?.close();
});

const decision = {
  model: "typesafe/service-1.13",
  state: "the checkout page returns 500",
  questions: { urgent: { type: "noul", instructions: "Is this urgent?" } },
};

/** `name;dur=ms` entries of a Server-Timing header, in order. */
function parseServerTiming(header: string | null): [string, number][] {
  return (header ?? "").split(", ").map((entry) => {
    const match = /^([a-z]+);dur=(\d+(?:\.\d)?)$/.exec(entry);
    if (!match) throw new Error(`not a Server-Timing entry: ${entry}`);
    return [match[1]!, Number(match[2])];
  });
}

/** A decision of `decision`'s state over the Connect protocol; returns the answer's request id. */
async function decideOverConnect(apiKey: string, questions: MessageInitShape<typeof DecideRequestSchema>["questions"]): Promise<string> {
  const client = createClient(DecisionService, createConnectTransport({ baseUrl: service.url, httpVersion: "1.1" }));
  let requestId = "";
  await client.decide(create(DecideRequestSchema, { model: decision.model, state: { kind: { case: "stringValue", value: decision.state } }, questions }), {
    headers: { authorization: `Bearer ${apiKey}` },
    onHeader: (headers) => (requestId = headers.get("x-request-id") ?? ""),
  });
  return requestId;
}

const callLine = (requestId: string) => logLines.find((line) => line["msg"] === "call" && line["request_id"] === requestId);

describe("Server-Timing and the call log line", () => {
  it("a metered gateway answer names admit, upstream, settle and total, and the log line carries the same durations", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const response = await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey });
    expect(response.status).toBe(200);

    const timing = parseServerTiming(response.headers.get("server-timing"));
    expect(timing.map(([name]) => name)).toEqual(["admit", "upstream", "settle", "total"]);
    const [admit, upstream, settle, total] = timing.map(([, ms]) => ms) as [number, number, number, number];
    expect(upstream).toBeGreaterThanOrEqual(UPSTREAM_DELAY_MS);
    expect(admit).toBeLessThan(upstream);
    // Each figure is rounded to 0.1 ms, so the parts may exceed the whole by rounding alone.
    expect(total).toBeGreaterThanOrEqual(admit + upstream + settle - 0.15);

    const line = callLine(response.headers.get("x-request-id")!);
    expect(line).toMatchObject({ status: "ok", protocol: "gateway", admit_ms: admit, upstream_ms: upstream, settle_ms: settle });
    expect(line!["duration_ms"]).toBeGreaterThanOrEqual(upstream);
  });

  it("a decision logs one line, on either surface: the call line carries what it asked and used", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const response = await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey });
    expect(response.status).toBe(200);
    const usage = response.body.data["usage"] as Record<string, number>;
    const connectRequestId = await decideOverConnect(apiKey, {
      urgent: { type: "noul", instructions: "Is this urgent?" },
      later: { type: "noul", instructions: "Can it wait until Monday?" },
    });

    const linesOf = (requestId: string) => logLines.filter((line) => line["request_id"] === requestId);
    const [gatewayLine, ...gatewayRest] = linesOf(response.headers.get("x-request-id")!);
    expect(gatewayRest).toEqual([]);
    expect(gatewayLine).toMatchObject({
      msg: "call",
      status: "ok",
      prompt_version: PROMPT_VERSION,
      questions: 1,
      answered: 1,
      input_tokens: usage["input_tokens"],
      cached_input_tokens: usage["cached_input_tokens"],
      upstream_calls: usage["upstream_calls"],
    });
    const [connectLine, ...connectRest] = linesOf(connectRequestId);
    expect(connectRest).toEqual([]);
    expect(connectLine).toMatchObject({ msg: "call", status: "ok", prompt_version: PROMPT_VERSION, questions: 2, answered: 2 });
  });

  it("a call refused before admission reports only its total", async () => {
    const response = await postJson(`${service.url}/api/v1/decisions`, decision, {});
    expect(response.status).toBe(401);
    expect(parseServerTiming(response.headers.get("server-timing")).map(([name]) => name)).toEqual(["total"]);
    const line = callLine(response.headers.get("x-request-id")!);
    expect(line).toMatchObject({ status: "error", reason: "UNAUTHENTICATED" });
    expect(line).not.toHaveProperty("admit_ms");
  });

  it("a Connect call logs the same phases", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const line = callLine(await decideOverConnect(apiKey, { urgent: { type: "noul", instructions: "Is this urgent?" } }));
    expect(line).toMatchObject({ status: "ok", procedure: "/typesafe.decision.v1.DecisionService/Decide" });
    expect(line!["upstream_ms"]).toBeGreaterThanOrEqual(UPSTREAM_DELAY_MS);
    expect(line!["admit_ms"]).toEqual(expect.any(Number));
    expect(line!["settle_ms"]).toEqual(expect.any(Number));
  });
});
