import http from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";

let database: TestDatabase;
let service: TestApp;
let apiKey: string;

beforeAll(async () => {
  database = await createTestDatabase();
  service = await startTestApp(database);
  ({ apiKey } = await createTestAccount(database.db, { units: 5_000_000 }));
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

const valid = {
  model: "typesafe/service-1.13",
  state: { ticket: "refund please" },
  questions: { q1: { type: "noul", instructions: "Is this a refund request?" } },
};
const withQuestion = (question: unknown) => ({ ...valid, questions: { q3: question } });
const nested = (levels: number): unknown => (levels === 0 ? "x" : { a: nested(levels - 1) });
const UNICODE_RULE = "must be valid Unicode text (no lone surrogates)";
const forty = Object.fromEntries(Array.from({ length: 41 }, (_, i) => [`q${i}`, { type: "noul", instructions: "x" }]));

describe("POST /api/v1/decisions rejects invalid input before anything is charged", () => {
  it.each([
    ["wrong model", { ...valid, model: "gpt-4" }, "model", 'must be "typesafe/service-1.13"'],
    ["missing model", { state: "s", questions: valid.questions }, "model", "must be"],
    ["missing state", { model: valid.model, questions: valid.questions }, "state", "is required"],
    ["empty text state", { ...valid, state: "  " }, "state", "must not be empty"],
    ["no questions", { ...valid, questions: {} }, "questions", "1 to 40 questions, got 0"],
    ["41 questions", { ...valid, questions: forty }, "questions", "1 to 40 questions, got 41"],
    ["unknown type", withQuestion({ type: "rank", instructions: "x" }), "questions.q3.type", "must be one of noul, choice, score"],
    ["empty instructions", withQuestion({ type: "noul", instructions: " " }), "questions.q3.instructions", "non-empty"],
    ["noul with criteria", withQuestion({ type: "noul", instructions: "x", criteria: ["a", "b"] }), "questions.q3.criteria", "noul takes no criteria"],
    ["choice without criteria", withQuestion({ type: "choice", instructions: "x" }), "questions.q3.criteria", "choice needs an object of at least 2 options"],
    ["choice with one option", withQuestion({ type: "choice", instructions: "x", criteria: { a: null } }), "questions.q3.criteria", "at least 2 options"],
    ["choice with an array", withQuestion({ type: "choice", instructions: "x", criteria: ["a", "b"] }), "questions.q3.criteria", "at least 2 options"],
    ["choice option not null", withQuestion({ type: "choice", instructions: "x", criteria: { a: null, b: 1 } }), "questions.q3.criteria.b", "must map to null"],
    ["score with one label", withQuestion({ type: "score", instructions: "x", criteria: ["low"] }), "questions.q3.criteria", "at least 2 distinct"],
    ["score with an object", withQuestion({ type: "score", instructions: "x", criteria: { low: null, high: null } }), "questions.q3.criteria", "array"],
    ["score duplicate labels", withQuestion({ type: "score", instructions: "x", criteria: ["low", "low"] }), "questions.q3.criteria[1]", "duplicate label"],
    ["score empty label", withQuestion({ type: "score", instructions: "x", criteria: ["low", ""] }), "questions.q3.criteria[1]", "non-empty"],
    ["score labels equal once trimmed", withQuestion({ type: "score", instructions: "x", criteria: ["a", " a"] }), "questions.q3.criteria[1]", 'duplicate label " a": same as [0]'],
    ["score labels equal but for a newline", withQuestion({ type: "score", instructions: "x", criteria: ["low", "high", "low\n"] }), "questions.q3.criteria[2]", "same as [0] apart from whitespace"],
    ["score labels equal but for inner spaces", withQuestion({ type: "score", instructions: "x", criteria: ["very low", "very  low"] }), "questions.q3.criteria[1]", "duplicate label"],
    ["choice options equal once trimmed", withQuestion({ type: "choice", instructions: "x", criteria: { a: null, " a": null } }), 'questions.q3.criteria[" a"]', 'duplicate option: same as "a"'],
    ["state a number", { ...valid, state: 123 }, "state", "must be a text or a JSON object"],
    ["state true", { ...valid, state: true }, "state", "must be a text or a JSON object"],
    ["state an array", { ...valid, state: ["a"] }, "state", "must be a text or a JSON object"],
    ["state an empty array", { ...valid, state: [] }, "state", "must be a text or a JSON object"],
    ["state an empty object", { ...valid, state: {} }, "state", "must not be empty"],
    ["state nested 33 levels", { ...valid, state: nested(33) }, "state", "nesting deeper than 32 levels"],
    ["state nested 100 levels", { ...valid, state: nested(100) }, "state", "nesting deeper than 32 levels"],
    ["state too deep through arrays", { ...valid, state: { a: JSON.parse("[".repeat(40) + "]".repeat(40)) } }, "state", "nesting deeper than 32 levels"],
    ["state with an infinite number", `{"model":"typesafe/service-1.13","state":{"n":1e999},"questions":{"q":{"type":"noul","instructions":"x"}}}`, "state.n", "must be a finite number"],
    ["lone surrogate in the state text", `{"model":"typesafe/service-1.13","state":"\\ud800","questions":{"q":{"type":"noul","instructions":"x"}}}`, "state", UNICODE_RULE],
    ["lone surrogate in a state key", `{"model":"typesafe/service-1.13","state":{"\\udc00":"x"},"questions":{"q":{"type":"noul","instructions":"x"}}}`, 'state["\\udc00"]', UNICODE_RULE],
    ["lone surrogate in instructions", `{"model":"typesafe/service-1.13","state":"x","questions":{"q":{"type":"noul","instructions":"why \\ud800?"}}}`, "questions.q.instructions", UNICODE_RULE],
    ["lone surrogate in a question key", `{"model":"typesafe/service-1.13","state":"x","questions":{"\\ud83d":{"type":"noul","instructions":"x"}}}`, 'questions["\\ud83d"]', UNICODE_RULE],
    ["lone surrogate in a score label", withQuestion({ type: "score", instructions: "x", criteria: ["low", "\udfff"] }), "questions.q3.criteria[1]", UNICODE_RULE],
    ["unknown top-level field", { ...valid, temperature: 0 }, "temperature", "unknown field"],
    ["unknown nested field", withQuestion({ type: "noul", instructions: "x", instuctions: "typo" }), "questions.q3.instuctions", "unknown field"],
    ["wrong JSON type", { ...valid, model: 13 }, "model", "must be a string"],
    ["questions as an array", { ...valid, questions: [] }, "questions", "must be a JSON object"],
    ["body not an object", [1, 2], "body", "must be a JSON object"],
  ])("%s → 400 naming %s", async (_name, body, field, rule) => {
    const { status, body: envelope } = await postJson(`${service.url}/api/v1/decisions`, body, { apiKey });
    expect(status).toBe(400);
    expect(envelope.code).toBe(40001);
    expect(envelope.data["reason"]).toBe("INVALID_ARGUMENT");
    expect(envelope.data["field"]).toBe(field);
    expect(envelope.data["rule"]).toContain(rule);
    expect(envelope.message).toContain(`${field}: `);
    expect(envelope.message).toContain(rule);
  });

  it.each([
    ["a state nested 32 levels", { ...valid, state: nested(32) }],
    ["score labels that differ only in case", withQuestion({ type: "score", instructions: "x", criteria: ["A", "a"] })],
    ["choice options that differ only in case", withQuestion({ type: "choice", instructions: "x", criteria: { Yes: null, yes: null } })],
    ["an emoji (a valid surrogate pair) in the state", { ...valid, state: "🙂" }],
    ["a state object with a number", { ...valid, state: { n: 1 } }],
  ])("%s passes validation", async (_name, body) => {
    const { status, body: envelope } = await postJson(`${service.url}/api/v1/decisions`, body, { apiKey });
    // No upstream LLM is configured here: a valid request ends at 503 NOT_CONFIGURED.
    expect(status).toBe(503);
    expect(envelope.data["reason"]).toBe("NOT_CONFIGURED");
  });

  it("malformed JSON → 400 MALFORMED_JSON", async () => {
    const { status, body } = await postJson(`${service.url}/api/v1/decisions`, '{"model": ', { apiKey });
    expect(status).toBe(400);
    expect(body).toMatchObject({ code: 40002, data: { reason: "MALFORMED_JSON", field: "body" } });
  });

  it.each([
    ["text/plain", { "content-type": "text/plain" }],
    ["empty", { "content-type": "" }],
    ["application/jsonx", { "content-type": "application/jsonx" }],
  ])("content type %s → 415 with field and rule", async (_name, headers) => {
    const { status, body } = await postJson(`${service.url}/api/v1/decisions`, JSON.stringify(valid), { apiKey, headers });
    expect(status).toBe(415);
    expect(body).toMatchObject({
      code: 41501,
      message: "content-type: must be application/json",
      data: { reason: "UNSUPPORTED_MEDIA_TYPE", field: "content-type", rule: "must be application/json" },
    });
  });

  it("no content type at all → 415 (fetch would add text/plain, so the request is written by hand)", async () => {
    const { status, body } = await rawPost("/api/v1/decisions", [JSON.stringify(valid)], { "content-type": undefined });
    expect(status).toBe(415);
    expect(JSON.parse(body)).toMatchObject({ code: 41501, data: { field: "content-type", rule: "must be application/json" } });
  });

  it("a content type with parameters is JSON", async () => {
    const { status } = await postJson(`${service.url}/api/v1/decisions`, JSON.stringify(valid), {
      apiKey,
      headers: { "content-type": "Application/JSON; charset=utf-8" },
    });
    expect(status).toBe(503);
  });
});

describe("POST /api/v1/search validation", () => {
  it.each([
    ["missing q", {}, "q", "is required"],
    ["301 characters", { q: "a".repeat(301) }, "q", "at most 300 characters, got 301"],
    ["unknown window", { q: "x", w: "1y" }, "w", "must be one of any, 24h, 7d, 30d"],
    ["unknown source", { q: "x", s: ["google", "brave"] }, "s", 'unknown source ids "google"; allowed: brave, exa'],
    ["empty source list", { q: "x", s: [] }, "s", "at least one source"],
    ["duplicate source", { q: "x", s: ["brave", "brave"] }, "s", 'lists "brave" twice'],
    ["s not an array", { q: "x", s: "brave" }, "s", "must be an array"],
    ["lone high surrogate in q", '{"q":"\\ud800"}', "q", UNICODE_RULE],
    ["lone low surrogate in q", '{"q":"a\\udc00b"}', "q", UNICODE_RULE],
    ["lone surrogate in a source id", '{"q":"x","s":["brave","\\ud800"]}', "s[1]", UNICODE_RULE],
  ])("%s → 400 naming %s", async (_name, body, field, rule) => {
    const { status, body: envelope } = await postJson(`${service.url}/api/v1/search`, body, { apiKey });
    expect(status).toBe(400);
    expect(envelope.data["field"]).toBe(field);
    expect(envelope.data["rule"]).toContain(rule);
    expect(envelope.message).toContain(rule);
  });

  it("counts code points: 300 emoji are a valid query", async () => {
    const { status, body } = await postJson(`${service.url}/api/v1/search`, { q: "🙂".repeat(300) }, { apiKey });
    expect(body.data["field"]).not.toBe("q");
    expect(status).not.toBe(400);
  });
});

describe("authentication", () => {
  const revokedCase = async () => {
    const account = await createTestAccount(database.db);
    await database.db("api_keys").where({ id: account.keyId }).update({ revoked_at: new Date() });
    return `Bearer ${account.apiKey}`;
  };
  it.each([
    ["missing header", async () => undefined],
    ["not a bearer", async () => `Basic ${Buffer.from("a:b").toString("base64")}`],
    ["malformed key", async () => "Bearer ts_live_short"],
    ["bad checksum", async () => `Bearer ${apiKey.slice(0, -1)}${apiKey.endsWith("A") ? "B" : "A"}`],
    ["unknown key", async () => `Bearer ${(await createUnsavedKey())}`],
    ["revoked key", revokedCase],
  ])("%s → 401 on both endpoints", async (_name, header) => {
    const authorization = await header();
    for (const [path, body] of [["/api/v1/decisions", valid], ["/api/v1/search", { q: "x" }]] as const) {
      const { status, body: envelope } = await postJson(`${service.url}${path}`, body, {
        headers: authorization ? { authorization } : {},
      });
      expect(status).toBe(401);
      expect(envelope).toMatchObject({ code: 40101, data: { reason: "UNAUTHENTICATED" } });
      expect(JSON.stringify(envelope)).not.toContain(apiKey);
    }
  });
});

async function createUnsavedKey(): Promise<string> {
  const { generateApiKey } = await import("../../src/keys/api-keys.js");
  return generateApiKey();
}

describe("body size, paths and methods", () => {
  const big = JSON.stringify({ ...valid, state: "x".repeat(96 * 1024) });

  it("a body over 96 KB by Content-Length → 413 before parsing", async () => {
    const { status, body } = await postJson(`${service.url}/api/v1/decisions`, big, { apiKey });
    expect(status).toBe(413);
    expect(body).toMatchObject({ code: 41301, data: { reason: "PAYLOAD_TOO_LARGE" } });
  });

  it("a chunked body over 96 KB → 413", async () => {
    const { status, body } = await rawPost("/api/v1/decisions", [big.slice(0, 50_000), big.slice(50_000)]);
    expect(status).toBe(413);
    expect(JSON.parse(body)).toMatchObject({ code: 41301 });
  });

  it("a chunked body under the limit is read whole", async () => {
    const text = JSON.stringify({ ...valid, model: "nope" });
    const { status, body } = await rawPost("/api/v1/decisions", [text.slice(0, 10), text.slice(10)]);
    expect(status).toBe(400);
    expect(JSON.parse(body).data.field).toBe("model");
  });

  it("unknown path → 404 envelope", async () => {
    const response = await fetch(`${service.url}/api/v2/decisions`, { method: "POST" });
    expect(response.status).toBe(404);
    expect(await response.json()).toMatchObject({ code: 40401, data: { reason: "NOT_FOUND" } });
  });

  it("wrong method → 405 envelope with Allow", async () => {
    const response = await fetch(`${service.url}/api/v1/decisions`);
    expect(response.status).toBe(405);
    expect(response.headers.get("allow")).toBe("POST");
    expect(await response.json()).toMatchObject({ code: 40501, data: { reason: "METHOD_NOT_ALLOWED" } });
  });

  it("health probes answer in the envelope", async () => {
    // No upstream and the embedded model off here: the probes say decisions are off.
    expect(await (await fetch(`${service.url}/healthz`)).json()).toEqual({ code: 0, message: "ok", data: { status: "up", decisions: { engine: "off" } } });
    const ready = await fetch(`${service.url}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ code: 0, message: "ok", data: { status: "ready", decisions: { engine: "off" } } });
  });
});

/** A chunked POST (no Content-Length), written piece by piece; a header given as undefined is not sent. */
function rawPost(path: string, pieces: string[], extraHeaders: Record<string, string | undefined> = {}): Promise<{ status: number; body: string }> {
  const headers = { "content-type": "application/json", authorization: `Bearer ${apiKey}`, "transfer-encoding": "chunked", ...extraHeaders };
  return new Promise((resolve, reject) => {
    const req = http.request(`${service.url}${path}`, {
      method: "POST",
      headers: Object.fromEntries(Object.entries(headers).filter(([, value]) => value !== undefined)) as Record<string, string>,
    });
    req.on("response", (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => (body += chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
    for (const piece of pieces) req.write(piece);
    req.end();
  });
}
