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
    expect(envelope.message).toContain(`${field}: `);
    expect(envelope.message).toContain(rule);
  });

  it("malformed JSON → 400 MALFORMED_JSON", async () => {
    const { status, body } = await postJson(`${service.url}/api/v1/decisions`, '{"model": ', { apiKey });
    expect(status).toBe(400);
    expect(body).toMatchObject({ code: 40002, data: { reason: "MALFORMED_JSON", field: "body" } });
  });

  it("a content type other than JSON → 415", async () => {
    const { status, body } = await postJson(`${service.url}/api/v1/decisions`, JSON.stringify(valid), {
      apiKey,
      headers: { "content-type": "text/plain" },
    });
    expect(status).toBe(415);
    expect(body.code).toBe(41501);
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
  ])("%s → 400 naming %s", async (_name, body, field, rule) => {
    const { status, body: envelope } = await postJson(`${service.url}/api/v1/search`, body, { apiKey });
    expect(status).toBe(400);
    expect(envelope.data["field"]).toBe(field);
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
  const { generateApiKey } = await import("../../src/accounts/api-keys.js");
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
    expect(await (await fetch(`${service.url}/healthz`)).json()).toEqual({ code: 0, message: "ok", data: { status: "up" } });
    const ready = await fetch(`${service.url}/readyz`);
    expect(ready.status).toBe(200);
  });
});

/** A chunked POST (no Content-Length), written piece by piece. */
function rawPost(path: string, pieces: string[]): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${service.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}`, "transfer-encoding": "chunked" },
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
