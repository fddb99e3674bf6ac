import { afterEach, expect } from "vitest";
import { recordAnswer, takeViolations } from "./openapi-conformance.js";

/**
 * vitest setup file, loaded for every test file: every answer a test receives
 * through fetch is checked against the OpenAPI document
 * (openapi-conformance.ts), and a test that received an undocumented gateway
 * answer fails in afterEach.
 */
const originalFetch = globalThis.fetch;
globalThis.fetch = async (input: string | URL | Request, init?: RequestInit) => {
  const response = await originalFetch(input, init);
  await recordAnswer(input, init, response);
  return response;
};

afterEach(() => {
  expect(takeViolations(), "gateway answers that the OpenAPI document does not describe").toEqual([]);
});
