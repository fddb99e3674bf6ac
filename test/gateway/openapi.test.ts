import fs from "node:fs";
import http from "node:http";
import { Validator } from "@seriousme/openapi-schema-validator";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OPENAPI_DOCUMENT_PATH } from "../../src/openapi/served.js";
import { createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { checkedAnswerCount, checkedRequestCount, requestViolationsOf, violationsOf, type SentRequest } from "../support/openapi-conformance.js";

let database: TestDatabase;
let service: TestApp;

beforeAll(async () => {
  database = await createTestDatabase();
  service = await startTestApp(database);
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

describe("GET /api/v1/openapi.json", () => {
  it("serves the committed document, without a key", async () => {
    const response = await fetch(`${service.url}/api/v1/openapi.json`);
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toBe("application/json; charset=utf-8");
    expect(await response.text()).toBe(fs.readFileSync(OPENAPI_DOCUMENT_PATH, "utf8"));
  });

  it("is a valid OpenAPI 3.1 document (by @seriousme/openapi-schema-validator)", async () => {
    const validator = new Validator();
    const result = await validator.validate(JSON.parse(fs.readFileSync(OPENAPI_DOCUMENT_PATH, "utf8")));
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);
    expect(validator.version).toBe("3.1");
  });

  it("declares the contract's paths, the key, Idempotency-Key and every error status", () => {
    const document = JSON.parse(fs.readFileSync(OPENAPI_DOCUMENT_PATH, "utf8"));
    // The account area's paths have their own section, checked in test/session-door/account.gateway.test.ts.
    expect(Object.keys(document.paths).filter((path) => !path.startsWith("/account/v1/"))).toEqual(["/api/v1/decisions", "/api/v1/search", "/api/v1/sources", "/healthz", "/readyz"]);
    const decide = document.paths["/api/v1/decisions"].post;
    expect(decide.security).toEqual([{ apiKey: [] }]);
    expect(decide.parameters).toEqual([{ $ref: "#/components/parameters/IdempotencyKey" }]);
    expect(Object.keys(decide.responses)).toEqual(["200", "400", "401", "402", "403", "404", "405", "409", "413", "415", "422", "429", "499", "500", "502", "503"]);
    expect(Object.keys(decide.responses["200"].headers)).toEqual(["x-request-id", "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "idempotent-replayed"]);
    expect(document.components.responses.Error429.description).toContain("CONCURRENCY_LIMITED");
    expect(document.components.responses.Error403.description).toContain("KEY_SCOPE_DENIED");
    expect(document.components.responses.Error402.description).toContain("KEY_BUDGET_EXCEEDED");
    expect(document.paths["/api/v1/sources"].get.parameters).toEqual([]);
  });

  it("requires in requests what validation requires, and nothing else", () => {
    const { schemas } = JSON.parse(fs.readFileSync(OPENAPI_DOCUMENT_PATH, "utf8")).components;
    expect(schemas["typesafe.decision.v1.DecideRequest"].required).toEqual(["model", "state", "questions"]);
    expect(schemas["typesafe.search.v1.SearchRequest"].required).toEqual(["q"]);
    const shapes = ["noul", "choice", "score"].map((type) => schemas[`typesafe.decision.v1.Question.${type}`].required);
    expect(shapes).toEqual([["type", "instructions"], ["type", "instructions", "criteria"], ["type", "instructions", "criteria"]]);
    // Answers keep the output rule: implicit fields are always there.
    expect(schemas["typesafe.search.v1.SearchResponse"].required).toEqual(["q", "results", "sources", "s", "w"]);
  });

  it("a POST to it is 405 with Allow: GET", async () => {
    const response = await fetch(`${service.url}/api/v1/openapi.json`, { method: "POST" });
    expect(response.status).toBe(405);
    expect(response.headers.get("allow")).toBe("GET");
  });
});

describe("the suite checks every gateway answer against the document", () => {
  it("answers and requests of this file were checked, and a 401 and a 400 conform", async () => {
    const before = checkedAnswerCount();
    const requestsBefore = checkedRequestCount();
    const unauthenticated = await postJson(`${service.url}/api/v1/search`, { q: "x" });
    expect(unauthenticated.status).toBe(401);
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const invalid = await postJson(`${service.url}/api/v1/decisions`, { questions: {} }, { apiKey });
    expect(invalid.status).toBe(400);
    expect(checkedAnswerCount()).toBe(before + 2);
    expect(checkedRequestCount()).toBe(requestsBefore + 2);
  });

  it("requests written with node:http are checked too, body and answer", async () => {
    const before = checkedRequestCount();
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = http.request(`${service.url}/api/v1/search`, { method: "POST", headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" } });
      req.on("response", (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => (body += chunk));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
      });
      req.on("error", reject);
      req.write('{"q":');
      req.end('"x"}');
    });
    // Served past every request rule (no source is configured here): the check needed both pieces of the body to agree.
    expect([answer.status, JSON.parse(answer.body).data.reason]).toEqual([503, "NOT_CONFIGURED"]);
    expect(checkedRequestCount()).toBe(before + 1);
  });

  it("the checker refuses answers the document does not describe", () => {
    const headers = new Headers({ "x-request-id": "r1", "ratelimit-limit": "60", "ratelimit-remaining": "59", "ratelimit-reset": "1" });
    const ok = { code: 0, message: "ok", data: { sources: [] } };
    expect(violationsOf("GET", "/api/v1/sources", 200, headers, JSON.stringify(ok))).toEqual([]);
    // An undocumented field, a missing header, a wrong code for the status, an undocumented status.
    expect(violationsOf("GET", "/api/v1/sources", 200, headers, JSON.stringify({ ...ok, data: { sources: [], extra: 1 } }))[0]).toMatch(/must NOT have additional properties/);
    expect(violationsOf("GET", "/api/v1/sources", 200, new Headers(), JSON.stringify(ok))).toEqual(["GET /api/v1/sources → 200: header x-request-id missing"]);
    const wrongCode = { code: 40001, message: "no", data: { reason: "UNAUTHENTICATED" } };
    expect(violationsOf("POST", "/api/v1/search", 401, headers, JSON.stringify(wrongCode))[0]).toMatch(/code must be equal to one of the allowed values/);
    expect(violationsOf("POST", "/api/v1/search", 418, headers, "{}")).toEqual(["POST /api/v1/search → 418: status not documented"]);
    const missingRateLimit = new Headers({ "x-request-id": "r1" });
    const search = { code: 0, message: "ok", data: {} };
    expect(violationsOf("POST", "/api/v1/search", 200, missingRateLimit, JSON.stringify(search))).toContain("POST /api/v1/search → 200: header ratelimit-limit missing");
  });
});

describe("the suite checks every gateway request against the document", () => {
  const json = { "content-type": "application/json", authorization: "Bearer ts_live_x" };
  const sent = (body: string, headers: Record<string, string> = json, path = "/api/v1/search"): SentRequest => ({
    method: "POST",
    url: `http://127.0.0.1:1${path}`,
    headers: new Headers(headers),
    body: Buffer.from(body),
  });
  const ok = { status: 200, headers: new Headers(), body: "{}" };
  const refused = (status: number, detail: Record<string, unknown>) => ({ status, headers: new Headers(), body: JSON.stringify({ code: 1, message: "no", data: detail }) });

  it("a request both accept, or both refuse, is fine", () => {
    expect(requestViolationsOf(sent('{"q":"x"}'), ok)).toEqual([]);
    // Bad JSON, a wrong content type, an oversized body, a missing key: refused by both.
    expect(requestViolationsOf(sent('{"q":'), refused(400, { reason: "MALFORMED_JSON" }))).toEqual([]);
    expect(requestViolationsOf(sent('{"q":"x"}', { ...json, "content-type": "text/plain" }), refused(415, { reason: "UNSUPPORTED_MEDIA_TYPE" }))).toEqual([]);
    expect(requestViolationsOf(sent('{"q":"x"}', { "content-type": "application/json" }), refused(401, { reason: "UNAUTHENTICATED" }))).toEqual([]);
    expect(requestViolationsOf(sent('{"q":"x","s":[]}'), refused(400, { reason: "INVALID_ARGUMENT", field: "s" }))).toEqual([]);
    expect(requestViolationsOf({ ...sent("", json, "/api/v1/decisions"), method: "GET" }, refused(405, { reason: "METHOD_NOT_ALLOWED" }))).toEqual([]);
  });

  it("a request the document refuses but the service serves is a violation", () => {
    expect(requestViolationsOf(sent('{"q":"x","w":"1y"}'), ok)).toEqual([expect.stringContaining("the service served a request the document refuses (body: data/w must be equal to one of the allowed values)")]);
    // Served after every rule passed: refused for money, not for its shape.
    expect(requestViolationsOf(sent("{}"), refused(402, { reason: "INSUFFICIENT_BALANCE" }))).toEqual([expect.stringContaining("required property 'q'")]);
    expect(requestViolationsOf(sent('{"q":"x"}', { ...json, "content-type": "text/plain" }), ok)).toEqual([expect.stringContaining('content type "text/plain" is not documented')]);
    expect(requestViolationsOf(sent('{"q":"x"}', { "content-type": "application/json" }), ok)).toEqual([expect.stringContaining("no Authorization: Bearer key")]);
    expect(requestViolationsOf(sent('{"q":"x"}', { ...json, "idempotency-key": "" }), ok)).toEqual([expect.stringContaining("header Idempotency-Key")]);
  });

  it("a request the document accepts but the service refuses is a violation, unless the document states that rule in words only", () => {
    const rule = (detail: Record<string, unknown>) => requestViolationsOf(sent('{"q":"x"}'), refused(400, { reason: "INVALID_ARGUMENT", field: "q", ...detail }));
    expect(rule({ rule: "must be a palindrome" })).toEqual([expect.stringContaining("the document accepts a request the service refuses (INVALID_ARGUMENT q: must be a palindrome)")]);
    expect(rule({ rule: "must be valid Unicode text (no lone surrogates)" })).toEqual([]);
    expect(rule({ rule: "supported_by_sources" })).toEqual([]);
    // A 413 is the body's size only when the body was larger than the limit it names.
    expect(requestViolationsOf(sent('{"q":"x"}'), refused(413, { reason: "PAYLOAD_TOO_LARGE", metadata: { max_bytes: "4" } }))).toEqual([]);
    expect(requestViolationsOf(sent('{"q":"x"}'), refused(413, { reason: "PAYLOAD_TOO_LARGE", metadata: { max_bytes: "98304" } }))).toEqual([expect.stringContaining("PAYLOAD_TOO_LARGE")]);
  });

  it("answers that say nothing about the request are not held against it", () => {
    expect(requestViolationsOf(sent("{}"), refused(500, { reason: "INTERNAL" }))).toBeUndefined();
    expect(requestViolationsOf(sent("{}"), refused(499, { reason: "CANCELLED" }))).toBeUndefined();
    // Paths the document does not have: Connect and gRPC on the same port, /metrics, unknown paths.
    expect(requestViolationsOf(sent("{}", json, "/typesafe.search.v1.SearchService/Search"), ok)).toBeUndefined();
    expect(requestViolationsOf(sent("", json, "/api/v2/search"), refused(404, { reason: "NOT_FOUND" }))).toBeUndefined();
  });
});
