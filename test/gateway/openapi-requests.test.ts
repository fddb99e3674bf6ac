import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { startFakeSearch, type FakeSearch } from "../support/fake-search/providers.js";
import { checkedRequestCount, documentRefusalOf } from "../support/openapi-conformance.js";

/**
 * The request schemas of the OpenAPI document against the service's own
 * validation, rule by rule, on a real gateway. The account holds no money, so
 * a request that passes every rule is refused at admission (402) before any
 * upstream is asked; one that breaks a rule is a 400. Each case also states
 * what the document says, and the suite's conformance check compares the two
 * on every request as well.
 */

let database: TestDatabase;
let llm: FakeLlm;
let search: FakeSearch;
let service: TestApp;
let apiKey: string;

beforeAll(async () => {
  database = await createTestDatabase();
  llm = await startFakeLlm();
  search = await startFakeSearch();
  service = await startTestApp(database, { TYPESAFE_LLM_BASE_URL: `${llm.url}/v1`, TYPESAFE_LLM_MODEL: "fake-model", ...search.env });
  ({ apiKey } = await createTestAccount(database.db, { units: 0, freeRequests: 0 }));
});
afterAll(async () => {
  await service?.stop();
  await search?.close();
  await llm?.close();
  await database?.close();
});

/** Passes every rule: the service answers INSUFFICIENT_BALANCE. */
const SERVED = 402;
const REFUSED = 400;

const model = "typesafe/service-1.13";
const noul = { type: "noul", instructions: "Is it urgent?" };
const decision = (change: Record<string, unknown>) => ({ model, state: "a ticket", questions: { q: noul }, ...change });
const withQuestion = (question: Record<string, unknown>) => decision({ questions: { q: question } });
const questions = (count: number) => Object.fromEntries(Array.from({ length: count }, (_, i) => [`q${i}`, noul]));

type Case = [name: string, body: unknown, status: number, documentAccepts: boolean];

const decisionCases: Case[] = [
  ["the three required fields", decision({}), SERVED, true],
  ["a JSON object as state", decision({ state: { ticket: "x" } }), SERVED, true],
  ["no model", { state: "a ticket", questions: { q: noul } }, REFUSED, false],
  ["another model", decision({ model: "gpt-4o" }), REFUSED, false],
  ["no state", { model, questions: { q: noul } }, REFUSED, false],
  ["a null state", decision({ state: null }), REFUSED, false],
  ["a blank state", decision({ state: " \n " }), REFUSED, false],
  ["an empty object as state", decision({ state: {} }), REFUSED, false],
  ["a number as state", decision({ state: 7 }), REFUSED, false],
  ["an array as state", decision({ state: ["a"] }), REFUSED, false],
  ["no questions", { model, state: "a ticket" }, REFUSED, false],
  ["an empty questions object", decision({ questions: {} }), REFUSED, false],
  ["40 questions", decision({ questions: questions(40) }), SERVED, true],
  ["41 questions", decision({ questions: questions(41) }), REFUSED, false],
  ["a blank question key", decision({ questions: { " ": noul } }), REFUSED, false],
  ["a question key with a control character", decision({ questions: { "a\u0001": noul } }), REFUSED, false],
  ["a question key of 128 characters", decision({ questions: { ["k".repeat(128)]: noul } }), SERVED, true],
  ["a question key of 129 characters", decision({ questions: { ["k".repeat(129)]: noul } }), REFUSED, false],
  ["a null question", decision({ questions: { q: null } }), REFUSED, false],
  ["a question without type", withQuestion({ instructions: "Is it?" }), REFUSED, false],
  ["a question of an unknown type", withQuestion({ type: "yesno", instructions: "Is it?" }), REFUSED, false],
  ["a question without instructions", withQuestion({ type: "noul" }), REFUSED, false],
  ["blank instructions", withQuestion({ type: "noul", instructions: "  " }), REFUSED, false],
  ["a noul question with null criteria", withQuestion({ ...noul, criteria: null }), SERVED, true],
  ["a noul question with criteria", withQuestion({ ...noul, criteria: { a: null, b: null } }), REFUSED, false],
  ["a choice of two options", withQuestion({ type: "choice", instructions: "Which?", criteria: { a: null, b: null } }), SERVED, true],
  ["a choice without criteria", withQuestion({ type: "choice", instructions: "Which?" }), REFUSED, false],
  ["a choice of one option", withQuestion({ type: "choice", instructions: "Which?", criteria: { a: null } }), REFUSED, false],
  ["a choice option mapped to a value", withQuestion({ type: "choice", instructions: "Which?", criteria: { a: null, b: 1 } }), REFUSED, false],
  ["a choice as a list", withQuestion({ type: "choice", instructions: "Which?", criteria: ["a", "b"] }), REFUSED, false],
  ["a choice with a blank option", withQuestion({ type: "choice", instructions: "Which?", criteria: { a: null, " ": null } }), REFUSED, false],
  ["a score of two labels", withQuestion({ type: "score", instructions: "How much?", criteria: ["low", "high"] }), SERVED, true],
  ["a score of one label", withQuestion({ type: "score", instructions: "How much?", criteria: ["low"] }), REFUSED, false],
  ["a score of 27 labels", withQuestion({ type: "score", instructions: "How much?", criteria: Array.from({ length: 27 }, (_, i) => `l${i}`) }), REFUSED, false],
  ["a score with a repeated label", withQuestion({ type: "score", instructions: "How much?", criteria: ["low", "low"] }), REFUSED, false],
  ["a score with a number label", withQuestion({ type: "score", instructions: "How much?", criteria: ["low", 2] }), REFUSED, false],
  ["a score as an object", withQuestion({ type: "score", instructions: "How much?", criteria: { low: null, high: null } }), REFUSED, false],
  ["an unknown field", decision({ temperature: 0 }), REFUSED, false],
  ["an unknown question field", withQuestion({ ...noul, weight: 1 }), REFUSED, false],
  // Rules the document states in words only: the schema accepts these.
  ["score labels that differ only in whitespace", withQuestion({ type: "score", instructions: "How much?", criteria: ["low", " low"] }), REFUSED, true],
  ["a state with a lone surrogate", decision({ state: "\udc00" }), REFUSED, true],
];

const searchCases: Case[] = [
  ["only q", { q: "rust async" }, SERVED, true],
  ["q, s and w", { q: "rust async", s: ["brave", "exa"], w: "7d" }, SERVED, true],
  ["null s and w", { q: "rust async", s: null, w: null }, SERVED, true],
  ["an empty w", { q: "rust async", w: "" }, SERVED, true],
  ["q of 300 characters outside the BMP", { q: "🦀".repeat(300) }, SERVED, true],
  ["q of 301 characters", { q: "x".repeat(301) }, REFUSED, false],
  ["no q", { s: ["brave"] }, REFUSED, false],
  ["an empty q", { q: "" }, REFUSED, false],
  ["a blank q", { q: " \t " }, REFUSED, false],
  ["a number as q", { q: 5 }, REFUSED, false],
  ["an empty s", { q: "x", s: [] }, REFUSED, false],
  ["an unknown source", { q: "x", s: ["bing"] }, REFUSED, false],
  ["a source twice", { q: "x", s: ["brave", "brave"] }, REFUSED, false],
  ["an unknown window", { q: "x", w: "1y" }, REFUSED, false],
  ["an unknown field", { q: "x", n: 10 }, REFUSED, false],
];

async function send(path: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; refusal: string | undefined }> {
  const init = { "content-type": "application/json", authorization: `Bearer ${apiKey}`, ...headers };
  const text = JSON.stringify(body);
  const response = await fetch(`${service.url}${path}`, { method: "POST", headers: init, body: text });
  await response.body?.cancel();
  return { status: response.status, refusal: documentRefusalOf("POST", path, new Headers(init), Buffer.from(text)) };
}

describe("the document's request schemas agree with the service's validation", () => {
  it.each(decisionCases)("POST /api/v1/decisions: %s", async (_, body, status, documentAccepts) => {
    const before = checkedRequestCount();
    const answer = await send("/api/v1/decisions", body);
    expect(answer.status).toBe(status);
    expect(answer.refusal === undefined).toBe(documentAccepts);
    expect(checkedRequestCount()).toBe(before + 1);
  });

  it.each(searchCases)("POST /api/v1/search: %s", async (_, body, status, documentAccepts) => {
    const answer = await send("/api/v1/search", body);
    expect(answer.status).toBe(status);
    expect(answer.refusal === undefined).toBe(documentAccepts);
  });

  it.each([
    ["a key of 255 characters", "k".repeat(255), SERVED, true],
    ["a key of 256 characters", "k".repeat(256), REFUSED, false],
  ] as const)("Idempotency-Key: %s", async (_, key, status, documentAccepts) => {
    const answer = await send("/api/v1/search", { q: "x" }, { "idempotency-key": key });
    expect(answer.status).toBe(status);
    expect(answer.refusal === undefined).toBe(documentAccepts);
  });
});
