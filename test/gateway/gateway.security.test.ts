import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { ValueSchema, type Value } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { validateDecideRequest } from "../../src/decision/validate.js";
import { DecideRequestSchema, QuestionSchema, type DecideRequest } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { balanceUnits, createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";

let database: TestDatabase;
let service: TestApp;
let apiKey: string;
let accountId: string;

beforeAll(async () => {
  database = await createTestDatabase();
  service = await startTestApp(database);
  ({ apiKey, accountId } = await createTestAccount(database.db, { units: 5_000_000 }));
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

const PROTO_RULE = '"__proto__" is not allowed as a key';
const noul = (instructions: string) => ({ type: "noul", instructions });

/**
 * JSON.parse keeps a `__proto__` key as an own property, but protobuf-es's
 * fromJson assigns it into a plain object, which sets the prototype: the entry
 * vanished and the call was answered (and charged) without it.
 */
describe("__proto__ keys are refused, never silently dropped", () => {
  it.each([
    ["a question key", `{"model":"typesafe/service-1.13","state":"x","questions":{"keep":${JSON.stringify(noul("a"))},"__proto__":${JSON.stringify(noul("b"))}}}`, "questions.__proto__"],
    ["a choice option", `{"model":"typesafe/service-1.13","state":"x","questions":{"q":{"type":"choice","instructions":"pick","criteria":{"__proto__":null,"b":null,"c":null}}}}`, "questions.q.criteria.__proto__"],
    ["a key of the state object", `{"model":"typesafe/service-1.13","state":{"__proto__":{"plan":"pro"},"ticket":"refund"},"questions":{"q":${JSON.stringify(noul("a"))}}}`, "state.__proto__"],
    ["a key nested in the state", `{"model":"typesafe/service-1.13","state":{"ticket":{"lines":[{"__proto__":1}]}},"questions":{"q":${JSON.stringify(noul("a"))}}}`, "state.ticket.lines[0].__proto__"],
  ])("in %s → 400 naming it, nothing charged", async (_name, raw, field) => {
    const before = await balanceUnits(database.db, accountId);
    const { status, body } = await postJson(`${service.url}/api/v1/decisions`, raw, { apiKey });
    expect(status).toBe(400);
    expect(body).toMatchObject({ code: 40001, message: `${field}: ${PROTO_RULE}`, data: { reason: "INVALID_ARGUMENT", field, rule: PROTO_RULE } });
    expect(await balanceUnits(database.db, accountId)).toBe(before);
  });
});

/** gRPC callers send binary maps; the decoder keeps a `__proto__` key as an own entry, which validation refuses like the gateway does. */
describe("validateDecideRequest refuses __proto__ keys of binary (gRPC) requests", () => {
  /** A request whose binary form carries a `__proto__` key at the place `plant` puts it. */
  const decoded = (plant: (request: DecideRequest) => void): DecideRequest => {
    const request = create(DecideRequestSchema, {
      model: "typesafe/service-1.13",
      state: struct({ ticket: text("refund") }),
      questions: { keep: create(QuestionSchema, { type: "noul", instructions: "a" }) },
    });
    plant(request);
    return fromBinary(DecideRequestSchema, toBinary(DecideRequestSchema, request));
  };

  it.each([
    ["a question key", (r: DecideRequest) => own(r.questions, create(QuestionSchema, { type: "noul", instructions: "b" })), "questions.__proto__"],
    [
      "a choice option",
      (r: DecideRequest) => {
        const criteria = struct({ b: nul(), c: nul() });
        own((criteria.kind.value as { fields: Record<string, Value> }).fields, nul());
        r.questions["keep"] = create(QuestionSchema, { type: "choice", instructions: "pick", criteria });
      },
      "questions.keep.criteria.__proto__",
    ],
    ["a state key", (r: DecideRequest) => own((r.state!.kind.value as { fields: Record<string, Value> }).fields, text("pro")), "state.__proto__"],
  ])("in %s", (_name, plant, field) => {
    expect(validateDecideRequest(decoded(plant))).toContainEqual({ field, rule: PROTO_RULE });
  });

  it("a request without such keys passes", () => {
    expect(validateDecideRequest(decoded(() => {}))).toEqual([]);
  });
});

/**
 * The key's presence and shape are checked before the body is read, so a
 * caller without a well-formed key gets 401 whatever it sends (the database
 * lookup of a well-formed key happens later, in metering).
 */
describe("a call without a well-formed key is 401 whatever its body", () => {
  const bodies: [string, string, Record<string, string>][] = [
    ["an empty object", "{}", {}],
    ["an unknown field", '{"x":1}', {}],
    ["malformed JSON", "{bad", {}],
    ["a 100 KB body", JSON.stringify({ q: "x".repeat(100 * 1024) }), {}],
    ["a text/plain body", "hello", { "content-type": "text/plain" }],
    ["a lone surrogate", '{"q":"\\ud800"}', {}],
  ];
  const keys: [string, Record<string, string>][] = [
    ["no Authorization", {}],
    ["a malformed key", { authorization: "Bearer ts_live_short" }],
    ["not a bearer", { authorization: "Basic YTpi" }],
  ];
  const cases = keys.flatMap(([keyName, auth]) => bodies.map(([bodyName, raw, headers]) => [keyName, bodyName, raw, { ...auth, ...headers }] as const));

  it.each(cases)("%s, %s → 401 on both POST paths", async (_key, _body, raw, headers) => {
    for (const path of ["/api/v1/decisions", "/api/v1/search"]) {
      const { status, body } = await postJson(`${service.url}${path}`, raw, { headers });
      expect(status).toBe(401);
      expect(body).toMatchObject({ code: 40101, data: { reason: "UNAUTHENTICATED" } });
    }
  });

  it("the connection stays usable after an unread body is refused", async () => {
    const big = JSON.stringify({ q: "x".repeat(100 * 1024) });
    for (let i = 0; i < 3; i++) {
      const { status } = await postJson(`${service.url}/api/v1/search`, big, {});
      expect(status).toBe(401);
    }
    const { status, body } = await postJson(`${service.url}/api/v1/search`, { q: "" }, { apiKey });
    expect(status).toBe(400);
    expect(body.data["field"]).toBe("q");
  });
});

function own(map: object, value: unknown): void {
  Object.defineProperty(map, "__proto__", { value, enumerable: true, configurable: true, writable: true });
}

function text(value: string): Value {
  return create(ValueSchema, { kind: { case: "stringValue", value } });
}

function nul(): Value {
  return create(ValueSchema, { kind: { case: "nullValue", value: 0 } });
}

function struct(fields: Record<string, Value>): Value {
  return create(ValueSchema, { kind: { case: "structValue", value: { fields } } });
}
