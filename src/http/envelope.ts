import type { ConnectNodeAdapterOptions } from "@connectrpc/connect-node";
import { toJson } from "@bufbuild/protobuf";
import { ErrorDetailSchema } from "../gen/typesafe/error/v1/error_pb.js";
import { REASONS, describeError } from "../errors.js";

type NodeHandler = NonNullable<ConnectNodeAdapterOptions["fallback"]>;
export type NodeRequest = Parameters<NodeHandler>[0];
export type NodeResponse = Parameters<NodeHandler>[1];

/** The body of every gateway answer: `code` 0 on success, else the reason's stable code. */
export interface Envelope {
  code: number;
  message: string;
  data: unknown;
}

export function sendEnvelope(res: NodeResponse, status: number, envelope: Envelope, headers: Record<string, string> = {}): void {
  const body = JSON.stringify(envelope);
  if (res.headersSent) return;
  res.writeHead(status, {
    ...headers,
    "content-type": "application/json; charset=utf-8",
    "content-length": String(Buffer.byteLength(body)),
    "cache-control": "no-store",
  });
  res.end(body);
}

export function sendOk(res: NodeResponse, data: unknown, headers: Record<string, string> = {}): void {
  sendEnvelope(res, 200, { code: 0, message: "ok", data }, headers);
}

/**
 * Renders an error already made public by observeCall: the reason's HTTP
 * status and envelope code, and the typed detail as `data`. Retry-After is
 * set from the detail's retry_after_seconds.
 */
export function sendError(res: NodeResponse, err: unknown, headers: Record<string, string> = {}): void {
  const { reason, detail, message } = describeError(err);
  const entry = REASONS[reason];
  sendEnvelope(
    res,
    entry.http,
    { code: entry.envelope, message, data: toJson(ErrorDetailSchema, detail, { useProtoFieldName: true }) },
    { ...headers, ...headersFromMetadata(detail.metadata) },
  );
}

/** Retry-After and the RateLimit-* fields that the metering error carries in its metadata. */
function headersFromMetadata(metadata: Record<string, string>): Record<string, string> {
  const headers: Record<string, string> = {};
  const pairs = [
    ["retry-after", "retry_after_seconds"],
    ["ratelimit-limit", "ratelimit_limit"],
    ["ratelimit-remaining", "ratelimit_remaining"],
    ["ratelimit-reset", "ratelimit_reset_seconds"],
  ] as const;
  for (const [header, key] of pairs) {
    const value = metadata[key];
    if (value !== undefined) headers[header] = value;
  }
  return headers;
}
