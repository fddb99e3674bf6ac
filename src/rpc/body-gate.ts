import { fromBinary, type DescMessage, type DescMethod, type Message } from "@bufbuild/protobuf";
import { createContextKey, createContextValues, type ConnectError } from "@connectrpc/connect";
import { bearerToken, isWellFormedApiKey } from "../accounts/api-keys.js";
import { apiError } from "../errors.js";
import { findShapeViolation } from "../gateway/json-shape.js";
import { throwIfInvalid, type Violation } from "../validation.js";
import type { universalRequestFromNodeRequest } from "@connectrpc/connect-node";

type UniversalRequest = ReturnType<typeof universalRequestFromNodeRequest>;

/**
 * The problem the body gate found with a request's body, raised by the
 * observe interceptor so it travels like every other error (typed detail,
 * log line, the protocol's own error format).
 */
export const kBodyProblem = createContextKey<ConnectError | undefined>(undefined, { description: "body problem" });

/**
 * Deep enough that the 32-level rule on free-form JSON (each level of a
 * google.protobuf.Value is two messages) is the one callers meet up to 64
 * levels; a message deeper still is refused as malformed, not decoded.
 */
export const RECURSION_LIMIT = 2 * 64 + 8;

/** Protocols and encodings of a unary request, read from its content type. */
interface WireFormat {
  binary: boolean;
  /** gRPC and gRPC-Web frame the message in a 5-byte envelope; Connect unary sends it bare. */
  enveloped: boolean;
}

function wireFormat(contentType: string | null): WireFormat | undefined {
  const type = contentType?.split(";")[0]?.trim().toLowerCase();
  switch (type) {
    case "application/proto":
      return { binary: true, enveloped: false };
    case "application/json":
      return { binary: false, enveloped: false };
    case "application/grpc":
    case "application/grpc+proto":
    case "application/grpc-web":
    case "application/grpc-web+proto":
      return { binary: true, enveloped: true };
    case "application/grpc+json":
    case "application/grpc-web+json":
      return { binary: false, enveloped: true };
    default:
      return undefined;
  }
}

export interface BodyGateOptions {
  maxBodyBytes: number;
  /** Services whose methods need an API key: without a well-formed one their body is never read. */
  keyedServices: ReadonlySet<string>;
  /** Rules of a request's JSON form that its message cannot express, by message type (the gateway applies the same). */
  jsonRules?: Readonly<Record<string, (json: Record<string, unknown>) => Violation | undefined>>;
}

/**
 * Reads the body of a unary RPC before Connect does, so a bad body is a
 * typed 4xx on gRPC and Connect as it is on the gateway: a message that does
 * not decode is MALFORMED_MESSAGE, JSON that breaks a shape rule names its
 * field (the gateway's own checks), an oversized one is PAYLOAD_TOO_LARGE
 * with the limit. The problem is put in the context and the handler gets an
 * empty message in its place, so the interceptor raises it through the
 * protocol's own error path. A call without a well-formed key is answered 401
 * without its body being read. Compressed bodies pass through to Connect.
 */
export async function gateBody(
  method: DescMethod,
  request: UniversalRequest,
  options: BodyGateOptions,
  /** Stops the rest of a body that is being dropped (after the answer, on HTTP/2 a reset with NO_ERROR). */
  abandonBody: () => void,
): Promise<UniversalRequest> {
  if (method.methodKind !== "unary" || request.method !== "POST") return request;
  const format = wireFormat(request.header.get("content-type"));
  if (!format || isCompressed(request.header, format)) return request;
  const body = request.body as AsyncIterable<Uint8Array>;
  const dropRest = (iterator: AsyncIterator<Uint8Array>) => drop(iterator, 16 * options.maxBodyBytes, abandonBody);
  if (options.keyedServices.has(method.parent.typeName) && !hasWellFormedKey(request.header)) {
    dropRest(body[Symbol.asyncIterator]());
    return withBody(request, emptyMessage(format));
  }
  const limit = options.maxBodyBytes + (format.enveloped ? 5 : 0);
  const bytes = await readUpTo(body, limit, dropRest);
  const checked =
    bytes === undefined ? { problem: payloadTooLarge(options.maxBodyBytes) } : checkBody(method.input, bytes, format, options.jsonRules?.[method.input.typeName]);
  if ("problem" in checked) {
    const contextValues = request.contextValues ?? createContextValues();
    contextValues.set(kBodyProblem, checked.problem);
    return withBody({ ...request, contextValues }, emptyMessage(format));
  }
  return withBody(request, bytes!, checked.decoded);
}

/** True when the gate answered for an oversized body on the Connect protocol, whose status must say 413. */
export function isConnectPayloadTooLarge(request: UniversalRequest): boolean {
  const problem = request.contextValues?.get(kBodyProblem);
  const format = wireFormat(request.header.get("content-type"));
  return problem !== undefined && format?.enveloped === false && problem.rawMessage.startsWith(TOO_LARGE_PREFIX);
}

/** The body's problem, or the message it decodes to (binary bodies; JSON is left to Connect's decoder). */
function checkBody(
  desc: DescMessage,
  body: Uint8Array,
  format: WireFormat,
  jsonRule: ((json: Record<string, unknown>) => Violation | undefined) | undefined,
): { problem: ConnectError } | { decoded?: Message } {
  const refuse = (problem: ConnectError) => ({ problem });
  let message = body;
  if (format.enveloped) {
    const view = new DataView(body.buffer, body.byteOffset, body.byteLength);
    const length = body.byteLength >= 5 ? view.getUint32(1) : -1;
    if (length < 0 || body.byteLength !== 5 + length) {
      return refuse(malformed(`the request must be exactly one enveloped message; got ${body.byteLength} bytes for a message of ${Math.max(length, 0)}`));
    }
    message = body.subarray(5);
  }
  if (format.binary) {
    try {
      return { decoded: fromBinary(desc, message, { readUnknownFields: true, recursionLimit: RECURSION_LIMIT }) };
    } catch (err) {
      return refuse(malformed(err instanceof Error ? err.message : String(err)));
    }
  }
  let json: unknown;
  try {
    json = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(message));
  } catch {
    return refuse(apiError("MALFORMED_JSON", "body: must be valid JSON", { field: "body", rule: "valid JSON" }));
  }
  const violation = findShapeViolation(desc, json) ?? jsonRule?.(json as Record<string, unknown>);
  try {
    throwIfInvalid(violation ? [violation] : []);
  } catch (err) {
    return refuse(err as ConnectError);
  }
  return {};
}

function malformed(decoderMessage: string): ConnectError {
  return apiError("MALFORMED_MESSAGE", `body: not a valid protobuf message: ${decoderMessage}`, {
    field: "body",
    rule: "a valid protobuf message of the request type",
    metadata: { decoder: decoderMessage },
  });
}

const TOO_LARGE_PREFIX = "body: must be at most";

function payloadTooLarge(maxBytes: number): ConnectError {
  return apiError("PAYLOAD_TOO_LARGE", `${TOO_LARGE_PREFIX} ${maxBytes / 1024} KB`, {
    field: "body",
    rule: `at most ${maxBytes} bytes`,
    metadata: { max_bytes: String(maxBytes) },
  });
}

function isCompressed(header: Headers, format: WireFormat): boolean {
  const encoding = header.get(format.enveloped ? "grpc-encoding" : "content-encoding");
  return encoding !== null && encoding !== "identity";
}

function hasWellFormedKey(header: Headers): boolean {
  const authorization = header.get("authorization");
  const key = authorization ? bearerToken(authorization) : undefined;
  return key !== undefined && isWellFormedApiKey(key);
}

/** The whole body, or undefined once it passes `limit` bytes (the rest is then dropped). */
async function readUpTo(
  body: AsyncIterable<Uint8Array>,
  limit: number,
  dropRest: (iterator: AsyncIterator<Uint8Array>) => void,
): Promise<Uint8Array | undefined> {
  const chunks: Uint8Array[] = [];
  let total = 0;
  const iterator = body[Symbol.asyncIterator]();
  for (;;) {
    const next = await iterator.next();
    if (next.done) break;
    total += next.value.byteLength;
    if (total > limit) {
      dropRest(iterator);
      return undefined;
    }
    chunks.push(next.value);
  }
  return chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, total);
}

/**
 * Reads and discards the rest of a refused body, so it occupies neither an
 * HTTP/1.1 connection nor an HTTP/2 session's flow-control window and memory
 * (refused bodies left unread there end in ENHANCE_YOUR_CALM for every later
 * stream); past `maxBytes` the body is abandoned instead.
 */
function drop(iterator: AsyncIterator<Uint8Array>, maxBytes: number, abandon: () => void): void {
  void (async () => {
    let dropped = 0;
    for (;;) {
      const next = await iterator.next();
      if (next.done) return;
      dropped += next.value.byteLength;
      if (dropped > maxBytes) return abandon();
    }
  })().catch(() => undefined);
}

function emptyMessage(format: WireFormat): Uint8Array {
  if (!format.enveloped) return format.binary ? new Uint8Array(0) : new TextEncoder().encode("{}");
  return new Uint8Array(format.binary ? [0, 0, 0, 0, 0] : [0, 0, 0, 0, 2, 0x7b, 0x7d]);
}

/** A body the gate read whole: its bytes and, when it checked a binary message, what they decode to. */
export interface GatedBody {
  bytes: Uint8Array;
  decoded?: Message;
}

/** The whole body of each request the gate has read, for a handler that takes it as one piece (grpc-unary.ts). */
const gatedBodies = new WeakMap<UniversalRequest, GatedBody>();

/** The body the gate read and checked (or put in place of a refused one); undefined if it passed the request through. */
export function gatedBody(request: UniversalRequest): GatedBody | undefined {
  return gatedBodies.get(request);
}

/** The request with these bytes as its body (Connect checks them against Content-Length, so it follows). */
function withBody(request: UniversalRequest, bytes: Uint8Array, decoded?: Message): UniversalRequest {
  let header = request.header;
  if (header.has("content-length") && header.get("content-length") !== String(bytes.byteLength)) {
    header = new Headers(header);
    header.set("content-length", String(bytes.byteLength));
  }
  const gated = {
    ...request,
    header,
    body: (async function* () {
      yield bytes;
    })(),
  };
  gatedBodies.set(gated, { bytes, decoded });
  return gated;
}
