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
}

/** Connect unary over HTTP/1.1: `application/json` or `application/proto`. */
export async function callConnect(baseUrl: string, path: string, body: string | Uint8Array, init: { apiKey?: string; binary?: boolean } = {}): Promise<WireAnswer> {
  const response = await fetch(`${baseUrl}${path}`, {
    method: "POST",
    headers: {
      "content-type": init.binary ? "application/proto" : "application/json",
      ...(init.apiKey ? { authorization: `Bearer ${init.apiKey}` } : {}),
    },
    body: typeof body === "string" ? body : Buffer.from(body),
  });
  const bytes = new Uint8Array(await response.arrayBuffer());
  const requestId = response.headers.get("x-request-id") ?? undefined;
  if (response.ok) return { status: response.status, requestId, detailTypes: [], body: bytes };
  const error = JSON.parse(Buffer.from(bytes).toString("utf8")) as { details?: { type: string; value: string }[] };
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
  };
}

/** One gRPC unary call over h2c with raw bytes: `message` is enveloped here unless `raw` says it already is. */
export async function callGrpc(
  baseUrl: string,
  path: string,
  message: Uint8Array,
  init: { apiKey?: string; json?: boolean; raw?: boolean; session?: http2.ClientHttp2Session } = {},
): Promise<WireAnswer> {
  const session = init.session ?? http2.connect(baseUrl);
  try {
    const stream = session.request({
      ":method": "POST",
      ":path": path,
      "content-type": init.json ? "application/grpc+json" : "application/grpc",
      te: "trailers",
      ...(init.apiKey ? { authorization: `Bearer ${init.apiKey}` } : {}),
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
    const status = Number(tail["grpc-status"]);
    const details = tail["grpc-status-details-bin"];
    const anys = typeof details === "string" ? statusDetails(Buffer.from(details, "base64")) : [];
    const ours = anys.find((a) => a.typeUrl.endsWith(`/${ErrorDetailSchema.typeName}`));
    const detail = ours ? fromBinary(ErrorDetailSchema, ours.value) : undefined;
    const requestId = (tail["x-request-id"] ?? head["x-request-id"]) as string | undefined;
    return {
      status,
      reason: detail?.reason,
      field: detail?.field || undefined,
      metadata: detail?.metadata,
      requestId,
      detailTypes: anys.map((a) => a.typeUrl.slice(a.typeUrl.lastIndexOf("/") + 1)),
      body: Buffer.concat(chunks),
    };
  } finally {
    if (!init.session) session.close();
  }
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
