import http2 from "node:http2";
import net from "node:net";
import { create, toBinary } from "@bufbuild/protobuf";
import { ValueSchema, type Value } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateApiKey } from "../../src/keys/api-keys.js";
import { apiError, describeError, STORE_RETRY_AFTER_SECONDS, toPublicError } from "../../src/errors.js";
import { BadRequestSchema, RetryInfoSchema } from "../../src/gen/google/rpc/error_details_pb.js";
import { DecideRequestSchema } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { SearchRequestSchema } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { callConnect, callGrpc, envelope, type WireAnswer } from "../support/wire.js";

/**
 * One contract on every surface: the same bad input gets the same status,
 * reason and field on the JSON gateway, Connect (JSON and binary) and gRPC
 * (binary and JSON), and no input gets a 5xx.
 */
let database: TestDatabase;
let service: TestApp;
let apiKey: string;

const DECIDE = "/typesafe.decision.v1.DecisionService/Decide";
const SEARCH = "/typesafe.search.v1.SearchService/Search";
const LIST_SOURCES = "/typesafe.search.v1.SearchService/ListSources";
const GATEWAY = { [DECIDE]: "/api/v1/decisions", [SEARCH]: "/api/v1/search" } as const;
/** gRPC status of INVALID_ARGUMENT, UNAUTHENTICATED and RESOURCE_EXHAUSTED. */
const GRPC = { invalidArgument: 3, notFound: 5, resourceExhausted: 8, unauthenticated: 16 };

beforeAll(async () => {
  database = await createTestDatabase(4);
  service = await startTestApp(database);
  ({ apiKey } = await createTestAccount(database.db, { units: 1_000_000 }));
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

const decision = (init: Record<string, unknown> = {}) => ({
  model: "typesafe/service-1.13",
  state: "a ticket",
  questions: { q1: { type: "noul", instructions: "Is it urgent?" } },
  ...init,
});

/** The same JSON body on the four JSON-speaking surfaces. */
async function everyJsonSurface(path: typeof DECIDE | typeof SEARCH, body: string): Promise<Record<string, Pick<WireAnswer, "reason" | "field"> & { http?: number; grpc?: number }>> {
  const gateway = await postJson(`${service.url}${GATEWAY[path]}`, body, { apiKey });
  const connect = await callConnect(service.url, path, body, { apiKey });
  const grpcJson = await callGrpc(service.url, path, new TextEncoder().encode(body), { apiKey, json: true });
  const data = gateway.body.data as { reason?: string; field?: string };
  return {
    gateway: { http: gateway.status, reason: data.reason, field: data.field },
    connect: { http: connect.status, reason: connect.reason, field: connect.field },
    grpcJson: { grpc: grpcJson.status, reason: grpcJson.reason, field: grpcJson.field },
  };
}

describe("the same bad JSON gets the same verdict on the gateway, Connect and gRPC", () => {
  const surrogate = "\\udc00";
  it.each([
    ["a lone surrogate in a state text", DECIDE, `{"model":"typesafe/service-1.13","state":"x${surrogate}","questions":{"q1":{"type":"noul","instructions":"Ok?"}}}`, "state"],
    ["a lone surrogate in a state key", DECIDE, `{"model":"typesafe/service-1.13","state":{"k${surrogate}":1},"questions":{"q1":{"type":"noul","instructions":"Ok?"}}}`, `state["k\\udc00"]`],
    ["a lone surrogate in an option name", DECIDE, `{"model":"typesafe/service-1.13","state":"s","questions":{"q1":{"type":"choice","instructions":"Which?","criteria":{"a${surrogate}":null,"b":null}}}}`, `questions.q1.criteria["a\\udc00"]`],
    ["a lone surrogate in a score label", DECIDE, `{"model":"typesafe/service-1.13","state":"s","questions":{"q1":{"type":"score","instructions":"How?","criteria":["lo${surrogate}","hi"]}}}`, "questions.q1.criteria[0]"],
    ["a lone surrogate in the query", SEARCH, `{"q":"x${surrogate}"}`, "q"],
    ["an empty key", SEARCH, `{"":1}`, `[""]`],
    ["an unknown field", DECIDE, JSON.stringify({ ...decision(), extra: 1 }), "extra"],
    ["a wrong model", DECIDE, JSON.stringify(decision({ model: "gpt" })), "model"],
    ["no questions", DECIDE, JSON.stringify(decision({ questions: {} })), "questions"],
  ] as const)("%s → 400 INVALID_ARGUMENT naming %s", async (_name, path, body, field) => {
    const answers = await everyJsonSurface(path, body);
    const expected = { reason: "INVALID_ARGUMENT", field: JSON.parse(`"${field.replaceAll("\\", "\\\\").replaceAll('"', '\\"')}"`) as string };
    expect(answers).toEqual({
      gateway: { http: 400, ...expected },
      connect: { http: 400, ...expected },
      grpcJson: { grpc: GRPC.invalidArgument, ...expected },
    });
  });
});

/** A state nested `depth` objects deep, as a decoded google.protobuf.Value. */
function nestedState(depth: number): Value {
  let value = create(ValueSchema, { kind: { case: "stringValue", value: "leaf" } });
  for (let i = 0; i < depth; i++) value = create(ValueSchema, { kind: { case: "structValue", value: { fields: { a: value } } } });
  return value;
}

const binaryDecision = (state: Value) =>
  toBinary(DecideRequestSchema, create(DecideRequestSchema, { model: "typesafe/service-1.13", state, questions: { q1: { type: "noul", instructions: "Ok?" } } }));

describe("binary protobuf", () => {
  const INVALID_UTF8_MODEL = Uint8Array.of(0x0a, 0x02, 0xc3, 0x28);
  it.each([
    ["a truncated message", DECIDE, Uint8Array.of(0x0a, 0xff)],
    ["a field number 0", SEARCH, Uint8Array.of(0x00, 0x01)],
    ["a varint that never ends", SEARCH, Uint8Array.of(0x18, ...Array<number>(11).fill(0xff))],
    ["invalid UTF-8 in a string field", DECIDE, INVALID_UTF8_MODEL],
    ["a state nested past the decoder's limit", DECIDE, binaryDecision(nestedState(80))],
  ] as const)("%s is a 400 MALFORMED_MESSAGE on Connect and gRPC, never a 5xx", async (_name, path, bytes) => {
    const connect = await callConnect(service.url, path, bytes, { apiKey, binary: true });
    const grpc = await callGrpc(service.url, path, bytes, { apiKey });
    expect({ http: connect.status, reason: connect.reason, field: connect.field }).toEqual({ http: 400, reason: "MALFORMED_MESSAGE", field: "body" });
    expect({ grpc: grpc.status, reason: grpc.reason, field: grpc.field }).toEqual({ grpc: GRPC.invalidArgument, reason: "MALFORMED_MESSAGE", field: "body" });
  });

  it("a frame whose length disagrees with its bytes is malformed", async () => {
    const framed = envelope(toBinary(SearchRequestSchema, create(SearchRequestSchema, { q: "x" })));
    const answer = await callGrpc(service.url, SEARCH, framed.subarray(0, framed.length - 1), { apiKey, raw: true });
    expect([answer.status, answer.reason]).toEqual([GRPC.invalidArgument, "MALFORMED_MESSAGE"]);
  });

  it("a state nested 60 levels meets the 32-level rule, as JSON callers do", async () => {
    const json = JSON.stringify(decision({ state: JSON.parse(`${'{"a":'.repeat(60)}"leaf"${"}".repeat(60)}`) }));
    const gateway = await postJson(`${service.url}/api/v1/decisions`, json, { apiKey });
    const grpc = await callGrpc(service.url, DECIDE, binaryDecision(nestedState(60)), { apiKey });
    expect(gateway.body.data).toMatchObject({ reason: "INVALID_ARGUMENT", field: "state", rule: "nesting deeper than 32 levels" });
    expect([grpc.status, grpc.reason, grpc.field]).toEqual([GRPC.invalidArgument, "INVALID_ARGUMENT", "state"]);
  });

  it("a google.protobuf.Value with no kind inside the state is a 400 naming it", async () => {
    const state = create(ValueSchema, { kind: { case: "structValue", value: { fields: { a: create(ValueSchema) } } } });
    const connect = await callConnect(service.url, DECIDE, binaryDecision(state), { apiKey, binary: true });
    const grpc = await callGrpc(service.url, DECIDE, binaryDecision(state), { apiKey });
    expect([connect.status, connect.reason, connect.field]).toEqual([400, "INVALID_ARGUMENT", "state.a"]);
    expect([grpc.status, grpc.reason, grpc.field]).toEqual([GRPC.invalidArgument, "INVALID_ARGUMENT", "state.a"]);
  });

  it("without a well-formed key the answer is 401, whatever the body", async () => {
    for (const key of [undefined, "ts_live_nope"]) {
      const connect = await callConnect(service.url, SEARCH, Uint8Array.of(0x0a, 0xff), { apiKey: key, binary: true });
      const grpc = await callGrpc(service.url, SEARCH, Uint8Array.of(0x0a, 0xff), { apiKey: key });
      expect([connect.status, connect.reason]).toEqual([401, "UNAUTHENTICATED"]);
      expect([grpc.status, grpc.reason]).toEqual([GRPC.unauthenticated, "UNAUTHENTICATED"]);
    }
    const unknownKey = await callGrpc(service.url, SEARCH, toBinary(SearchRequestSchema, create(SearchRequestSchema, { q: "x" })), { apiKey: generateApiKey() });
    expect(unknownKey.reason).toBe("UNAUTHENTICATED");
  });
});

describe("oversized messages", () => {
  const oversized = toBinary(SearchRequestSchema, create(SearchRequestSchema, { q: "x".repeat(200 * 1024) }));

  it("are PAYLOAD_TOO_LARGE with the limit: HTTP 413 on Connect, RESOURCE_EXHAUSTED with the detail on gRPC", async () => {
    const connect = await callConnect(service.url, SEARCH, oversized, { apiKey, binary: true });
    const grpc = await callGrpc(service.url, SEARCH, oversized, { apiKey });
    expect([connect.status, connect.reason, connect.metadata?.["max_bytes"]]).toEqual([413, "PAYLOAD_TOO_LARGE", String(96 * 1024)]);
    expect([grpc.status, grpc.reason, grpc.metadata?.["max_bytes"]]).toEqual([GRPC.resourceExhausted, "PAYLOAD_TOO_LARGE", String(96 * 1024)]);
  });

  it("do not poison the HTTP/2 connection: valid calls on it still succeed after many refusals", async () => {
    const session = http2.connect(service.url);
    try {
      const big = toBinary(SearchRequestSchema, create(SearchRequestSchema, { q: "x".repeat(2 * 1024 * 1024) }));
      for (let i = 0; i < 12; i++) {
        expect((await callGrpc(service.url, SEARCH, big, { apiKey, session })).reason).toBe("PAYLOAD_TOO_LARGE");
      }
      const valid = await callGrpc(service.url, LIST_SOURCES, new Uint8Array(0), { apiKey, session });
      expect(valid.status).toBe(0);
    } finally {
      session.close();
    }
  });
});

describe("every answer names its request", () => {
  it("x-request-id on Connect answers and gRPC errors, equal to the detail's request id", async () => {
    const ok = await callConnect(service.url, LIST_SOURCES, "{}", { apiKey });
    expect(ok.status).toBe(200);
    expect(ok.requestId).toMatch(/^[0-9a-f-]{36}$/);
    const refused = await callConnect(service.url, SEARCH, "{}", { apiKey: "ts_live_nope" });
    expect(refused.requestId).toMatch(/^[0-9a-f-]{36}$/);
    const grpc = await callGrpc(service.url, SEARCH, new Uint8Array(0), { apiKey });
    expect(grpc.requestId).toMatch(/^[0-9a-f-]{36}$/);
  });

  it("a health check of an unknown service is NOT_FOUND, not a server error", async () => {
    const answer = await callGrpc(service.url, "/grpc.health.v1.Health/Check", Uint8Array.of(0x0a, 0x03, 0x66, 0x6f, 0x6f));
    expect([answer.status, answer.reason]).toEqual([GRPC.notFound, "NOT_FOUND"]);
  });
});

describe("the gateway's body limit", () => {
  it("a chunked body of 1 MB sent in 1 KB chunks gets the 413 envelope, not a reset", async () => {
    const { port } = new URL(service.url);
    const socket = net.connect(Number(port), "127.0.0.1");
    await new Promise((ready) => socket.once("connect", ready));
    const answer = new Promise<string>((resolve) => {
      let text = "";
      socket.on("data", (chunk: Buffer) => {
        text += chunk.toString();
        if (text.includes("\r\n\r\n") && text.includes("}}")) resolve(text);
      });
      socket.on("error", () => resolve(`reset after: ${text}`));
      socket.on("close", () => resolve(text));
    });
    socket.write(
      `POST /api/v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer ${apiKey}\r\nTransfer-Encoding: chunked\r\n\r\n`,
    );
    const chunk = `400\r\n${"x".repeat(1024)}\r\n`;
    for (let i = 0; i < 1024 && !socket.destroyed; i++) socket.write(chunk);
    socket.write("0\r\n\r\n");
    const text = await answer;
    socket.destroy();
    expect(text).toMatch(/^HTTP\/1\.1 413/);
    expect(text).toContain('"reason":"PAYLOAD_TOO_LARGE"');
  });
});

describe("standard google.rpc details beside ours", () => {
  it("a 400 carries google.rpc.BadRequest naming the field, on gRPC and Connect", async () => {
    const body = toBinary(SearchRequestSchema, create(SearchRequestSchema, { q: "" }));
    const grpc = await callGrpc(service.url, SEARCH, body, { apiKey });
    const connect = await callConnect(service.url, SEARCH, body, { apiKey, binary: true });
    for (const answer of [grpc, connect]) {
      expect(answer.field).toBe("q");
      expect(answer.detailTypes).toEqual(["typesafe.error.v1.ErrorDetail", "google.rpc.BadRequest"]);
    }
  });

  it.each([
    ["RATE_LIMITED", { retry_after_ms: "1500", retry_after_seconds: "2" }, { seconds: 1n, nanos: 500_000_000 }],
    ["UNAVAILABLE", { retry_after_seconds: "1" }, { seconds: 1n, nanos: 0 }],
  ] as const)("%s carries google.rpc.RetryInfo with the delay", (reason, metadata, delay) => {
    const error = toPublicError(apiError(reason, "later", { metadata: { ...metadata } }), "r1");
    expect(error.findDetails(RetryInfoSchema)[0]?.retryDelay).toMatchObject(delay);
    expect(error.findDetails(BadRequestSchema)).toEqual([]);
  });

  it.each([
    ["a store error of its own (a node turned read-only in a failover)", Object.assign(new Error("cannot execute UPDATE in a read-only transaction"), { code: "25006" })],
    ["an UNAVAILABLE raised without a delay", apiError("UNAVAILABLE", "the database is unreachable")],
  ])("%s is UNAVAILABLE with a retry delay of STORE_RETRY_AFTER_SECONDS", (_, err) => {
    const error = toPublicError(err, "r1");
    expect(describeError(error).reason).toBe("UNAVAILABLE");
    expect(describeError(error).detail.metadata).toMatchObject({ retry_after_seconds: String(STORE_RETRY_AFTER_SECONDS) });
    expect(error.findDetails(RetryInfoSchema)[0]?.retryDelay).toMatchObject({ seconds: BigInt(STORE_RETRY_AFTER_SECONDS), nanos: 0 });
  });
});
