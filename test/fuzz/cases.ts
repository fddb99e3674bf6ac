import { create, toBinary } from "@bufbuild/protobuf";
import fc from "fast-check";
import { REASONS, type Reason } from "../../src/errors.js";
import { DecideRequestSchema } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { SearchRequestSchema } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { postJson } from "../support/app.js";
import { callConnect, callGrpc, type WireAnswer } from "../support/wire.js";

/**
 * Generators and checks shared by the fuzz test in `npm test` (seeded, a few
 * seconds) and `npm run fuzz -- --seconds N` (long runs that print counts).
 * Inputs start from valid requests and are mutated; every answer must be a
 * 4xx with a reason (and a field for INVALID_ARGUMENT), or a documented 502/503,
 * never a 5xx of ours, never a leak of internals.
 */
export const DECIDE = "/typesafe.decision.v1.DecisionService/Decide";
export const SEARCH = "/typesafe.search.v1.SearchService/Search";
const GATEWAY_PATH = { [DECIDE]: "/api/v1/decisions", [SEARCH]: "/api/v1/search" } as const;
export type Rpc = typeof DECIDE | typeof SEARCH;

const text = fc.oneof(fc.string({ maxLength: 40 }), fc.constantFrom("", " ", "\udc00", "a\u0000b", "__proto__", "🙂".repeat(5)));
const question = fc.oneof(
  fc.record({ type: fc.constant("noul"), instructions: text }),
  fc.record({ type: fc.constant("choice"), instructions: text, criteria: fc.dictionary(text, fc.constant(null), { maxKeys: 4 }) }),
  fc.record({ type: fc.constant("score"), instructions: text, criteria: fc.array(text, { maxLength: 4 }) }),
);
const decideJson = fc.record({
  model: fc.oneof(fc.constant("typesafe/service-1.13"), text),
  state: fc.oneof(text, fc.dictionary(text, fc.jsonValue({ maxDepth: 3 }), { maxKeys: 3 })),
  questions: fc.dictionary(fc.string({ minLength: 1, maxLength: 8 }), question, { minKeys: 0, maxKeys: 3 }),
});
const searchJson = fc.record(
  { q: text, s: fc.array(fc.constantFrom("brave", "exa", "wikipedia", "google", ""), { maxLength: 3 }), w: fc.constantFrom("any", "24h", "7d", "30d", "1y", "") },
  { requiredKeys: ["q"] },
);

/** A JSON body: a generated request, sometimes with a field removed, replaced by any JSON, or added. */
export const jsonCase = fc
  .tuple(fc.constantFrom<Rpc>(DECIDE, SEARCH), decideJson, searchJson, fc.nat(3), fc.jsonValue({ maxDepth: 2 }), text)
  .map(([rpc, decide, search, mutation, anyJson, key]) => {
    const body: Record<string, unknown> = { ...(rpc === DECIDE ? decide : search) };
    const keys = Object.keys(body);
    const target = keys[key.length % keys.length]!;
    if (mutation === 1) delete body[target];
    if (mutation === 2) body[target] = anyJson;
    if (mutation === 3) body[key] = anyJson;
    return { rpc, body: JSON.stringify(body) };
  });

/** A binary body: a valid message's bytes with some flipped, cut off, or spliced with random bytes. */
export const binaryCase = fc
  .tuple(fc.constantFrom<Rpc>(DECIDE, SEARCH), fc.string({ maxLength: 30 }), fc.array(fc.tuple(fc.nat(), fc.nat(255)), { maxLength: 4 }), fc.nat(2), fc.uint8Array({ maxLength: 16 }))
  .map(([rpc, words, flips, mutation, extra]) => {
    const valid =
      rpc === DECIDE
        ? toBinary(DecideRequestSchema, create(DecideRequestSchema, { model: "typesafe/service-1.13", state: { kind: { case: "stringValue", value: words || "s" } }, questions: { q: { type: "noul", instructions: "ok?" } } }))
        : toBinary(SearchRequestSchema, create(SearchRequestSchema, { q: words || "q", w: "7d" }));
    let bytes = Uint8Array.from(valid);
    for (const [at, value] of flips) if (bytes.length > 0) bytes[at % bytes.length] = value;
    if (mutation === 1) bytes = bytes.subarray(0, Math.max(0, bytes.length - 1 - (extra.length % Math.max(1, bytes.length))));
    if (mutation === 2) bytes = Uint8Array.from([...bytes.subarray(0, extra.length), ...extra, ...bytes.subarray(extra.length)]);
    return { rpc, bytes };
  });

/** Reasons a 5xx may carry: the documented upstream and availability answers. */
const ALLOWED_5XX = new Set(["UPSTREAM_FAILED", "NOT_CONFIGURED", "UNAVAILABLE"]);
/** Stack frames, file paths, SQL and a key's secret part must never reach a caller. */
const LEAK = /\bat [^ ]+ \(|:\d+:\d+\)|node_modules|\/(work|home|root|tmp)\/|\b(SELECT|INSERT|UPDATE) |ts_live_[0-9A-Za-z]{6}/;

/** What must hold of any answer; returns the broken rule, or undefined. */
export function problemOf(answer: { status: number; grpc: boolean; reason?: string; field?: string; text: string }): string | undefined {
  if (LEAK.test(answer.text)) return `leak: ${answer.text.slice(0, 120)}`;
  if (answer.grpc ? answer.status === 0 : answer.status === 200) return undefined;
  if (answer.reason === undefined || !(answer.reason in REASONS)) return `no reason (status ${answer.status})`;
  const http = REASONS[answer.reason as Reason].http;
  if (http >= 500 && !ALLOWED_5XX.has(answer.reason)) return `server error: ${answer.reason}`;
  if (answer.reason === "INVALID_ARGUMENT" && !answer.field) return "INVALID_ARGUMENT without field";
  return undefined;
}

export interface Verdict {
  surface: string;
  status: number;
  reason?: string;
  field?: string;
  problem?: string;
}

function verdict(surface: string, answer: WireAnswer, grpc: boolean): Verdict {
  const text = JSON.stringify({ ...answer, body: undefined });
  return { surface, status: answer.status, reason: answer.reason, field: answer.field, problem: problemOf({ ...answer, grpc, text }) };
}

/** Sends one JSON body to the gateway and to Connect JSON. */
export async function sendJson(baseUrl: string, apiKey: string, rpc: Rpc, body: string): Promise<Verdict[]> {
  const gateway = await postJson(`${baseUrl}${GATEWAY_PATH[rpc]}`, body, { apiKey });
  const data = gateway.body.data as { reason?: string; field?: string };
  const gatewayVerdict: Verdict = {
    surface: "gateway",
    status: gateway.status,
    reason: data.reason,
    field: data.field,
    problem: problemOf({ status: gateway.status, grpc: false, reason: data.reason, field: data.field, text: JSON.stringify(gateway.body) }),
  };
  return [gatewayVerdict, verdict("connect-json", await callConnect(baseUrl, rpc, body, { apiKey }), false)];
}

/** Sends one binary body to Connect binary and to gRPC. */
export async function sendBinary(baseUrl: string, apiKey: string, rpc: Rpc, bytes: Uint8Array): Promise<Verdict[]> {
  return [
    verdict("connect-proto", await callConnect(baseUrl, rpc, bytes, { apiKey, binary: true }), false),
    verdict("grpc", await callGrpc(baseUrl, rpc, bytes, { apiKey }), true),
  ];
}
