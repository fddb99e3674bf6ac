import { fromBinary, type DescMessage, type DescMethod, type Message } from "@bufbuild/protobuf";
import { createContextKey, createContextValues, type ConnectError } from "@connectrpc/connect";
import type { Compression } from "@connectrpc/connect/protocol";
import type { universalRequestFromNodeRequest } from "@connectrpc/connect-node";
import { apiError, describeError } from "../errors.js";
import { kApiKey } from "../call/authentication.js";
import { kRequestProblem } from "../call/context.js";
import { apiKeyFrom } from "../keys/api-keys.js";
import { drainBody, payloadTooLarge, readBodyUpTo } from "../http/body.js";
import { compressionNamed, decompressBody, undecompressable, unsupportedEncoding } from "../http/compression.js";
import { decodeJsonRequest, parseJsonBody } from "../http/json-body.js";
import { dropUnholdableDeadline, takeDeadlineProblem } from "./grpc-timeout.js";

type UniversalRequest = ReturnType<typeof universalRequestFromNodeRequest>;


/**
 * Deep enough that the 32-level rule on free-form JSON (each level of a
 * google.protobuf.Value is two messages) is the one callers meet up to 64
 * levels; a message deeper still is refused as malformed, not decoded.
 */
export const RECURSION_LIMIT = 2 * 64 + 8;

/** How a unary request's body is carried, read from its content type. */
interface WireFormat {
  /** gRPC or gRPC-Web: the deadline is grpc-timeout, the encoding grpc-encoding. */
  grpcFamily: boolean;
  binary: boolean;
  /** gRPC and gRPC-Web frame the message in a 5-byte envelope; Connect unary sends it bare. */
  enveloped: boolean;
  /** The header naming the body's compression. */
  encodingHeader: string;
  /** The header that lists the encodings a server accepts, in this protocol. */
  acceptEncodingHeader: string;
}

const CONNECT_BINARY: WireFormat = { grpcFamily: false, binary: true, enveloped: false, encodingHeader: "content-encoding", acceptEncodingHeader: "accept-encoding" };
const CONNECT_JSON: WireFormat = { ...CONNECT_BINARY, binary: false };
const GRPC_BINARY: WireFormat = { grpcFamily: true, binary: true, enveloped: true, encodingHeader: "grpc-encoding", acceptEncodingHeader: "grpc-accept-encoding" };
const GRPC_JSON: WireFormat = { ...GRPC_BINARY, binary: false };

/** The content types Connect's handlers serve, as connect-es matches them (protocol-connect, protocol-grpc and protocol-grpc-web content-type.js). */
const CONNECT_UNARY_TYPE = /^application\/(?:(json)(?:; ?charset=utf-?8)?|proto)$/i;
const GRPC_TYPE = /^application\/grpc(?:-web)?(?:\+(?:(json)(?:; ?charset=utf-?8)?|proto))?$/i;

/**
 * The wire format of a unary request; undefined when no protocol serves the
 * content type (gRPC-Web's base64 text form included: Connect's handler
 * refuses it too).
 */
function wireFormat(contentType: string | null): WireFormat | undefined {
  // The content types every generated client sends, before any pattern.
  if (contentType === "application/grpc" || contentType === "application/grpc+proto") return GRPC_BINARY;
  if (contentType === "application/proto") return CONNECT_BINARY;
  if (contentType === "application/json") return CONNECT_JSON;
  if (contentType === null) return undefined;
  const connect = CONNECT_UNARY_TYPE.exec(contentType);
  if (connect) return connect[1] ? CONNECT_JSON : CONNECT_BINARY;
  const grpc = GRPC_TYPE.exec(contentType);
  if (grpc) return grpc[1] ? GRPC_JSON : GRPC_BINARY;
  return undefined;
}

export interface BodyGateOptions {
  maxBodyBytes: number;
  /** Services whose methods need an API key: without a well-formed one their body is never read. */
  keyedServices: ReadonlySet<string>;
}

/**
 * Reads the request of a unary RPC before Connect does, so every bad request
 * is a typed 4xx on gRPC, gRPC-Web and Connect as it is on the gateway. In
 * this order: the body's encoding (one the server does not accept is
 * UNSUPPORTED_ENCODING, with the accepted ones); the deadline header (too
 * large is no deadline, malformed is INVALID_ARGUMENT); the API key's shape
 * (without one the body is never read: UNAUTHENTICATED); the body's size on
 * the wire;
 * then decompression, bounded by the same limit (PAYLOAD_TOO_LARGE past it,
 * INVALID_ARGUMENT when it does not decompress); then the message itself (one
 * whole envelope; a message that does not decode is MALFORMED_MESSAGE; JSON
 * that breaks a shape rule names its field).
 *
 * The problem is put in the context and the handler gets an empty message in
 * its place, so the interceptor raises it through the protocol's own error
 * path. A body that passes is handed on as it came (Connect decompresses and
 * decodes it again), with the message it decoded to when it is binary.
 * Answers an error instead of a request when no protocol serves the content
 * type: the caller answers that one itself.
 */
export async function gateBody(
  method: DescMethod,
  request: UniversalRequest,
  options: BodyGateOptions,
  /** Stops the rest of a body that is being dropped (after the answer, on HTTP/2 a reset with NO_ERROR). */
  abandonBody: () => void,
): Promise<UniversalRequest | ConnectError> {
  if (method.methodKind !== "unary" || request.method !== "POST") {
    // Streaming calls are Connect's alone; only a deadline its timer cannot hold is taken off.
    dropUnholdableDeadline(request.header, request.header.get("content-type")?.startsWith("application/grpc") ?? false);
    return request;
  }
  const format = wireFormat(request.header.get("content-type"));
  const body = (request.body as AsyncIterable<Uint8Array>)[Symbol.asyncIterator]();
  const drop = () => drainBody(body, options.maxBodyBytes, abandonBody);
  if (format === undefined) {
    drop();
    return unsupportedMediaType();
  }
  const contextValues = request.contextValues ?? createContextValues();
  const encoding = request.header.get(format.encodingHeader);
  const compression = compressionNamed(encoding);
  const refuse = (problem: ConnectError) => {
    contextValues.set(kRequestProblem, problem);
    // The empty message in the body's place is not compressed: an envelope says so in its flag, a bare body only by
    // its header (whose removal changes nothing else: an error answer is too small to be compressed). An encoding
    // Connect's handler does not accept goes too: it would refuse it before any interceptor runs, without our detail.
    if (!format.enveloped || compression === undefined) request.header.delete(format.encodingHeader);
    return withBody({ ...request, contextValues }, emptyMessage(format));
  };

  // Taken first whatever else is wrong: Connect's handler would refuse a malformed deadline before any interceptor runs.
  const deadlineProblem = takeDeadlineProblem(request.header, format.grpcFamily);
  if (compression === undefined) return drop(), refuse(unsupportedEncoding(encoding!, format.encodingHeader, format.acceptEncodingHeader));
  if (deadlineProblem) return drop(), refuse(deadlineProblem);
  if (options.keyedServices.has(method.parent.typeName)) {
    const key = apiKeyFrom(request.header.get("authorization"));
    if ("error" in key) return drop(), refuse(key.error);
    contextValues.set(kApiKey, key.key);
  }

  const limit = options.maxBodyBytes + (format.enveloped ? 5 : 0);
  const bytes = await readBodyUpTo(body, limit, options.maxBodyBytes, abandonBody);
  if (bytes === undefined) return refuse(payloadTooLarge(options.maxBodyBytes));
  const framed = messageOf(bytes, format, compression);
  if (!("payload" in framed)) return refuse(framed);
  // Only a compressed body waits for the inflater; the common plain one goes on at once.
  const message = framed.compressed ? await decompressBody(compression!, framed.payload, options.maxBodyBytes) : framed.payload;
  if (!(message instanceof Uint8Array)) return refuse(message);
  const checked = checkMessage(method.input, message, format);
  if ("problem" in checked) return refuse(checked.problem);
  return withBody({ ...request, contextValues }, bytes, checked.decoded);
}

/** The error for a content type no protocol serves, answered in Connect's error format by the caller. */
function unsupportedMediaType(): ConnectError {
  const rule = "application/proto or application/json (Connect), application/grpc[+proto|+json] or application/grpc-web[+proto|+json]";
  return apiError("UNSUPPORTED_MEDIA_TYPE", `content-type: must be ${rule}`, { field: "content-type", rule });
}

/**
 * The message's bytes out of their envelope, and whether they are
 * compressed; or the caller's error: the body must be exactly one envelope,
 * and a compressed flag needs an encoding (grpc-go refuses it the same way,
 * "compressed flag set with identity or empty encoding").
 */
function messageOf(body: Uint8Array, format: WireFormat, compression: Compression | null): { payload: Uint8Array; compressed: boolean } | ConnectError {
  if (!format.enveloped) return { payload: body, compressed: compression !== null };
  const view = new DataView(body.buffer, body.byteOffset, body.byteLength);
  const length = body.byteLength >= 5 ? view.getUint32(1) : -1;
  if (length < 0 || body.byteLength !== 5 + length) {
    return malformed(`the request must be exactly one enveloped message; got ${body.byteLength} bytes for a message of ${Math.max(length, 0)}`);
  }
  // Only the lowest flag bit means anything in a request (compressed); Connect's handler ignores the others too.
  const compressed = (body[0]! & 1) === 1;
  if (compressed && compression === null) return undecompressable("identity", "compressed flag set with identity or empty encoding");
  return { payload: body.subarray(5), compressed };
}

/** The message's problem, or what it decodes to (binary bodies; JSON is left to Connect's decoder after its checks). */
function checkMessage(desc: DescMessage, message: Uint8Array, format: WireFormat): { problem: ConnectError } | { decoded?: Message } {
  if (format.binary) {
    try {
      return { decoded: fromBinary(desc, message, { readUnknownFields: true, recursionLimit: RECURSION_LIMIT }) };
    } catch (err) {
      return { problem: malformed(err instanceof Error ? err.message : String(err)) };
    }
  }
  try {
    // Decoded here only to find its problem: Connect's own decoder would refuse it without our detail.
    decodeJsonRequest(desc, parseJsonBody(message));
  } catch (err) {
    return { problem: err as ConnectError };
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

/** True when the gate refused the request's body for its size (its Connect answer must then say 413, as the gateway does). */
export function isPayloadTooLarge(request: UniversalRequest): boolean {
  const problem = request.contextValues?.get(kRequestProblem);
  return problem !== undefined && describeError(problem).reason === "PAYLOAD_TOO_LARGE";
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
