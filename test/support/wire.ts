import http2 from "node:http2";
import { fromBinary } from "@bufbuild/protobuf";
import { StatusSchema } from "../../src/gen/google/rpc/status_pb.js";
import { ErrorDetailSchema } from "../../src/gen/typesafe/error/v1/error_pb.js";

/**
 * Raw callers for the three surfaces, so tests can send any bytes (valid,
 * mutated, oversized) and read what each protocol answers: the HTTP status
 * (Connect) or grpc-status (gRPC), and our typed ErrorDetail however the
 * protocol carries it.
 */
export interface WireAnswer {
  /** HTTP status for the gateway and Connect; grpc-status for gRPC (0 = OK). */
  status: number;
  reason?: string;
  field?: string;
  metadata?: Record<string, string>;
  /** The x-request-id the answer carried (header, or gRPC trailer). */
  requestId?: string;
  /** Every google.protobuf.Any type URL in the error's details. */
  detailTypes: string[];
  body?: unknown;
  /** Connect: the error's `code`, when the error body is Connect's error JSON (undefined when it is not). */
  connectCode?: string;
  /** gRPC-Web: the HTTP status (200 unless the call never reached a protocol). */
  httpStatus?: number;
  /** Response headers, and on gRPC the trailers after them. */
  headers?: Record<string, string>;
}

/** What the raw callers may add to a call: more headers (encodings, deadlines) and another content type. */
export interface WireInit {
  apiKey?: string;
  headers?: Record<string, string>;
  contentType?: string;
}

/** Connect unary over HTTP/1.1: `application/json` or `application/proto`. */
export async function callConnect(baseUrl: string, path: string, body: string | Uint8Array, init: WireInit & { binary?: boolean } = {}): Promise<WireAnswer> {
  const response = await fetch(`${baseUrl}${path}`, {
    method: "POST",
    headers: {
      "content-type": init.contentType ?? (init.binary ? "application/proto" : "application/json"),
      ...(init.apiKey ? { authorization: `Bearer ${init.apiKey}` } : {}),
      ...init.headers,
    },
    body: typeof body === "string" ? body : Buffer.from(body),
  });
  const bytes = new Uint8Array(await response.arrayBuffer());
  const requestId = response.headers.get("x-request-id") ?? undefined;
  const headers = Object.fromEntries(response.headers);
  if (response.ok) return { status: response.status, requestId, detailTypes: [], body: bytes, headers };
  let error: { code?: string; details?: { type: string; value: string }[] } = {};
  try {
    error = JSON.parse(Buffer.from(bytes).toString("utf8")) as typeof error;
  } catch {
    // Not Connect's error JSON: no code, no details, which the callers' checks report.
  }
  const details = error.details ?? [];
  const ours = details.find((d) => d.type === ErrorDetailSchema.typeName);
  const detail = ours ? fromBinary(ErrorDetailSchema, Buffer.from(ours.value, "base64")) : undefined;
  return {
    status: response.status,
    reason: detail?.reason,
    field: detail?.field || undefined,
    metadata: detail?.metadata,
    requestId,
    detailTypes: details.map((d) => d.type),
    connectCode: typeof error.code === "string" ? error.code : undefined,
    headers,
  };
}

/** One gRPC unary call over h2c with raw bytes: `message` is enveloped here unless `raw` says it already is. */
export async function callGrpc(
  baseUrl: string,
  path: string,
  message: Uint8Array,
  init: WireInit & { json?: boolean; raw?: boolean; session?: http2.ClientHttp2Session } = {},
): Promise<WireAnswer> {
  const session = init.session ?? http2.connect(baseUrl);
  try {
    const stream = session.request({
      ":method": "POST",
      ":path": path,
      "content-type": init.contentType ?? (init.json ? "application/grpc+json" : "application/grpc"),
      te: "trailers",
      ...(init.apiKey ? { authorization: `Bearer ${init.apiKey}` } : {}),
      ...init.headers,
    });
    const headers = new Promise<http2.IncomingHttpHeaders>((resolve) => stream.once("response", resolve));
    const trailers = new Promise<http2.IncomingHttpHeaders>((resolve) => stream.once("trailers", resolve));
    const chunks: Buffer[] = [];
    stream.on("data", (chunk: Buffer) => chunks.push(chunk));
    const ended = new Promise<void>((resolve, reject) => {
      stream.once("close", () => resolve());
      stream.once("error", reject);
    });
    stream.end(init.raw ? message : envelope(message));
    await ended;
    const head = await headers;
    // A trailers-only answer carries its status in the headers.
    const tail = head["grpc-status"] !== undefined ? head : await trailers;
    return { ...grpcAnswer(tail), requestId: (tail["x-request-id"] ?? head["x-request-id"]) as string | undefined, body: Buffer.concat(chunks), headers: { ...flat(head), ...flat(tail) } };
  } finally {
    if (!init.session) session.close();
  }
}

/** gRPC-Web over HTTP/1.1: the trailers come as the last frame of the body (flag 0x80). */
export async function callGrpcWeb(baseUrl: string, path: string, message: Uint8Array, init: WireInit & { raw?: boolean } = {}): Promise<WireAnswer> {
  const response = await fetch(`${baseUrl}${path}`, {
    method: "POST",
    headers: {
      "content-type": init.contentType ?? "application/grpc-web+proto",
      ...(init.apiKey ? { authorization: `Bearer ${init.apiKey}` } : {}),
      ...init.headers,
    },
    body: Buffer.from(init.raw ? message : envelope(message)),
  });
  const bytes = Buffer.from(await response.arrayBuffer());
  const headers = Object.fromEntries(response.headers);
  let trailers: Record<string, string> = {};
  for (let at = 0; at + 5 <= bytes.byteLength; ) {
    const length = bytes.readUInt32BE(at + 1);
    if ((bytes[at]! & 0x80) === 0x80) {
      const lines = bytes.subarray(at + 5, at + 5 + length).toString("utf8").split("\r\n").filter((l) => l !== "");
      trailers = Object.fromEntries(lines.map((l) => [l.slice(0, l.indexOf(":")).trim().toLowerCase(), l.slice(l.indexOf(":") + 1).trim()]));
    }
    at += 5 + length;
  }
  // A trailers-only answer carries its status in the headers.
  const tail = headers["grpc-status"] !== undefined ? headers : trailers;
  return { ...grpcAnswer(tail), requestId: tail["x-request-id"] ?? headers["x-request-id"], httpStatus: response.status, headers: { ...headers, ...trailers } };
}

function flat(headers: http2.IncomingHttpHeaders): Record<string, string> {
  return Object.fromEntries(Object.entries(headers).map(([name, value]) => [name, Array.isArray(value) ? value.join(", ") : String(value)]));
}

/** The status and our typed detail of a gRPC or gRPC-Web answer, from its trailers. */
function grpcAnswer(tail: Record<string, string | string[] | undefined>): Omit<WireAnswer, "requestId"> {
  const status = Number(tail["grpc-status"]);
  const details = tail["grpc-status-details-bin"];
  const anys = typeof details === "string" ? statusDetails(Buffer.from(details, "base64")) : [];
  const ours = anys.find((a) => a.typeUrl.endsWith(`/${ErrorDetailSchema.typeName}`));
  const detail = ours ? fromBinary(ErrorDetailSchema, ours.value) : undefined;
  return {
    status,
    reason: detail?.reason,
    field: detail?.field || undefined,
    metadata: detail?.metadata,
    detailTypes: anys.map((a) => a.typeUrl.slice(a.typeUrl.lastIndexOf("/") + 1)),
  };
}

export function envelope(message: Uint8Array): Uint8Array {
  const framed = new Uint8Array(5 + message.byteLength);
  new DataView(framed.buffer).setUint32(1, message.byteLength);
  framed.set(message, 5);
  return framed;
}

/** The details of a google.rpc.Status (grpc-status-details-bin), read with the vendored proto. */
function statusDetails(bytes: Uint8Array): { typeUrl: string; value: Uint8Array }[] {
  return fromBinary(StatusSchema, bytes).details.map(({ typeUrl, value }) => ({ typeUrl, value }));
}
