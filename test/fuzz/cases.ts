import zlib from "node:zlib";
import { create, toBinary } from "@bufbuild/protobuf";
import fc from "fast-check";
import { REASONS, type Reason } from "../../src/errors.js";
import { DecideRequestSchema } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { SearchRequestSchema } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { postJson } from "../support/app.js";
import { callConnect, callGrpc, callGrpcWeb, type WireAnswer } from "../support/wire.js";

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

/** The encodings a caller may name: the accepted ones, identity, and one the server does not take. */
const ENCODINGS = ["gzip", "br", "identity", "zstd"] as const;
type Encoding = (typeof ENCODINGS)[number];
const COMPRESS: Partial<Record<Encoding, (bytes: Uint8Array) => Uint8Array>> = { gzip: (b) => zlib.gzipSync(b), br: (b) => zlib.brotliCompressSync(b) };
/** Bodies of a few KB at most that inflate past the 96 KB limit, compressed once on first use (brotli takes a while). */
const bombs: Partial<Record<Encoding, Uint8Array>> = {};
const bombOf = (encoding: Encoding, compress: (bytes: Uint8Array) => Uint8Array) => (bombs[encoding] ??= compress(new Uint8Array(2 * 1024 * 1024)));

/**
 * A compressed body: a mutated message (binaryCase) compressed with an
 * encoding the server accepts or not, sometimes a bomb, sometimes with its
 * compressed bytes damaged or cut; on gRPC and gRPC-Web sometimes with the
 * compressed flag set and no encoding named.
 */
export const compressedCase = fc
  .tuple(binaryCase, fc.constantFrom<Encoding | undefined>(...ENCODINGS, undefined), fc.nat(4), fc.nat(), fc.nat(255))
  .map(([{ rpc, bytes }, encoding, damage, at, value]) => {
    const compress = encoding ? COMPRESS[encoding] : undefined;
    let body = compress ? (damage === 1 ? bombOf(encoding!, compress) : compress(bytes)) : bytes;
    if (compress && damage === 2 && body.length > 0) (body = Uint8Array.from(body))[at % body.length] = value;
    if (compress && damage === 3) body = body.subarray(0, at % Math.max(1, body.length));
    // The flag says compressed when an encoding compressed it, and in one case in five when none did.
    const flag = compress !== undefined || damage === 4 ? 1 : 0;
    return { rpc, encoding, flag, body };
  });

export type CompressedCase = typeof compressedCase extends fc.Arbitrary<infer T> ? T : never;

function frameOf(flag: number, body: Uint8Array): Uint8Array {
  const framed = new Uint8Array(5 + body.byteLength);
  framed[0] = flag;
  new DataView(framed.buffer).setUint32(1, body.byteLength);
  framed.set(body, 5);
  return framed;
}

/** Sends one compressed case to gRPC, gRPC-Web and (a bare body, no flag) Connect binary. */
export async function sendCompressed(baseUrl: string, apiKey: string, c: CompressedCase): Promise<Verdict[]> {
  const grpcHeaders: Record<string, string> = c.encoding ? { "grpc-encoding": c.encoding } : {};
  const frame = frameOf(c.flag, c.body);
  return [
    verdict("grpc", await callGrpc(baseUrl, c.rpc, frame, { apiKey, raw: true, headers: grpcHeaders }), true),
    verdict("grpc-web", await callGrpcWeb(baseUrl, c.rpc, frame, { apiKey, raw: true, headers: grpcHeaders }), true),
    verdict("connect-proto", await callConnect(baseUrl, c.rpc, c.body, { apiKey, binary: true, headers: c.encoding ? { "content-encoding": c.encoding } : {} }), false),
  ];
}

/**
 * The verdicts of one compressed case that must agree: every surface when
 * the case means the same on each (an encoding named, or nothing compressed);
 * else gRPC and gRPC-Web only, since a bare Connect body has no flag. The
 * field may differ by the header each protocol names.
 */
export function comparableVerdicts(c: CompressedCase, verdicts: Verdict[]): string[] {
  const same = c.flag === 0 || (c.encoding !== undefined && c.encoding !== "identity") ? verdicts : verdicts.filter((v) => v.surface !== "connect-proto");
  return same.map((v) => `${v.reason}|${v.field?.endsWith("-encoding") ? "encoding header" : v.field}`);
}

/**
 * A unary gRPC request as raw bytes and headers, for the differential test of
 * the short path against Connect's handler: mutated messages, every encoding
 * with the flag set or not, deadlines of every form, frames cut short, bytes
 * after the message, two messages, and a length prefix that lies.
 */
export const grpcCase = fc
  .tuple(binaryCase, fc.constantFrom<Encoding | undefined>(...ENCODINGS, undefined), fc.boolean(), fc.constantFrom(undefined, "10S", "99999999H", "2147484S", "junk", "123456789m", "1h", ""), fc.nat(5), fc.uint8Array({ minLength: 1, maxLength: 8 }))
  .map(([{ rpc, bytes }, encoding, flagged, timeout, framing, extra]) => {
    const compress = encoding ? COMPRESS[encoding] : undefined;
    const body = flagged && compress ? compress(bytes) : bytes;
    let frame = frameOf(flagged ? 1 : 0, body);
    if (framing === 1) frame = frame.subarray(0, Math.max(0, frame.length - extra.length));
    if (framing === 2) frame = Uint8Array.from([...frame, ...extra]);
    if (framing === 3) frame = Uint8Array.from([...frame, ...frame]);
    if (framing === 4) new DataView(frame.buffer, frame.byteOffset).setUint32(1, body.length + extra.length);
    const headers: Record<string, string> = { ...(encoding ? { "grpc-encoding": encoding } : {}), ...(timeout !== undefined ? { "grpc-timeout": timeout } : {}) };
    return { rpc, frame, headers };
  });

export type GrpcCase = typeof grpcCase extends fc.Arbitrary<infer T> ? T : never;

/** What the differential test compares: the status, and the whole typed detail but the request id. */
export function grpcOutcome(answer: WireAnswer): string {
  return JSON.stringify({ status: answer.status, reason: answer.reason, field: answer.field, metadata: answer.metadata, message: answer.headers?.["grpc-message"] });
}

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
