import fs from "node:fs";
import { Validator } from "@seriousme/openapi-schema-validator";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OPENAPI_DOCUMENT_PATH } from "../../src/openapi/served.js";
import { createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { checkedAnswerCount, violationsOf } from "../support/openapi-conformance.js";

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
    expect(Object.keys(document.paths)).toEqual(["/api/v1/decisions", "/api/v1/search", "/api/v1/sources", "/healthz", "/readyz"]);
    const decide = document.paths["/api/v1/decisions"].post;
    expect(decide.security).toEqual([{ apiKey: [] }]);
    expect(decide.parameters).toEqual([{ $ref: "#/components/parameters/IdempotencyKey" }]);
    expect(Object.keys(decide.responses)).toEqual(["200", "400", "401", "402", "404", "405", "409", "413", "415", "422", "429", "499", "500", "502", "503"]);
    expect(Object.keys(decide.responses["200"].headers)).toEqual(["x-request-id", "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "idempotent-replayed"]);
    expect(document.components.responses.Error429.description).toContain("CONCURRENCY_LIMITED");
    expect(document.paths["/api/v1/sources"].get.parameters).toEqual([]);
  });

  it("a POST to it is 405 with Allow: GET", async () => {
    const response = await fetch(`${service.url}/api/v1/openapi.json`, { method: "POST" });
    expect(response.status).toBe(405);
    expect(response.headers.get("allow")).toBe("GET");
  });
});

describe("the suite checks every gateway answer against the document", () => {
  it("answers of this file were checked, and a 401 and a 400 conform", async () => {
    const before = checkedAnswerCount();
    const unauthenticated = await postJson(`${service.url}/api/v1/search`, { q: "x" });
    expect(unauthenticated.status).toBe(401);
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const invalid = await postJson(`${service.url}/api/v1/decisions`, { questions: {} }, { apiKey });
    expect(invalid.status).toBe(400);
    expect(checkedAnswerCount()).toBe(before + 2);
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
