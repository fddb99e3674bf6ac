import { create, fromJson, toJson, type DescMessage, type DescMethodUnary, type JsonValue, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { createContextValues, createHandlerContext, type HandlerContext } from "@connectrpc/connect";
import { apiError, describeError, toPublicError } from "../errors.js";
import type { Logger } from "../logger.js";
import { kCallPhases, serverTimingHeader, type CallPhases } from "../call/call-phases.js";
import { kRemoteAddress, kRequestId } from "../call/context.js";
import { observeCall, type CallObserver } from "../call/observe.js";
import type { Metrics } from "../metrics.js";
import { throwIfInvalid } from "../validation.js";
import { drainNodeBody, readNodeBody } from "../http/body.js";
import { ACCEPTED_ENCODING_NAMES, compressionNamed, decompressBody, unsupportedEncoding } from "../http/compression.js";
import { decodeJsonRequest, parseJsonBody } from "../http/json-body.js";
import { createRequestId } from "../call/request-id.js";
import { headerRecord, requestHeaders } from "../http/node-headers.js";
import { sendEnvelope, sendError, sendOk, type NodeRequest, type NodeResponse } from "../http/envelope.js";

/**
 * One JSON path served by a unary RPC. The gateway calls the very
 * implementation gRPC callers reach, with a handler context of its own, so
 * authentication, validation, limits and metering cannot drift between the
 * two surfaces (and no in-process transport is paid for).
 */
export interface RpcRoute<I extends DescMessage = DescMessage, O extends DescMessage = DescMessage> {
  httpMethod: "GET" | "POST";
  path: string;
  method: DescMethodUnary<I, O>;
  impl: (request: MessageShape<I>, ctx: HandlerContext) => MessageInitShape<O> | Promise<MessageInitShape<O>>;
  /** Who may call: checks the call's credentials (and sets its context) before its body is read; throws to refuse. */
  door: RouteDoor;
  /** Final touches on the JSON of `data` (e.g. nulls the contract promises). */
  reshapeAnswerJson?: (data: Record<string, unknown>) => void;
}

/**
 * The check a route's service puts in front of its calls: the API key for the
 * metered API, the session cookie for the account area. It runs first, so a
 * caller without the right credentials learns nothing about its body.
 */
export type RouteDoor = (ctx: HandlerContext) => void | Promise<void>;

export interface GatewayOptions {
  routes: RpcRoute[];
  logger: Logger;
  maxBodyBytes: number;
  /** True when the service can serve (database reachable). */
  isReady: () => Promise<boolean>;
  /** Aborted when a shutdown's grace period ends: calls still running are cut off (503). */
  shutdownSignal?: AbortSignal;
  /** Served at GET /metrics (Prometheus text format) and fed by every call. */
  metrics?: Metrics;
  /** The OpenAPI document of this surface (JSON text), served at GET /api/v1/openapi.json. */
  openApiDocument?: string;
  /** What decisions run on, reported by both probes (readiness never waits for the embedded model). */
  decisionsStatus?: () => DecisionsStatus;
}

/** The probes' view of decisions: which engine, and the embedded model's state. */
export interface DecisionsStatus {
  engine: "upstream" | "embedded" | "off";
  model_state?: "fetching" | "loading" | "ready" | "failed";
  percent?: number;
  /** After a failed download: when the next try is. */
  next_try_in_seconds?: number;
}

const OPENAPI_PATH = "/api/v1/openapi.json";

/** The fallback handler of the Connect adapter: the JSON paths of the routes, health probes, and enveloped 404/405. */
export function createGateway(options: GatewayOptions) {
  const observer: CallObserver = { logger: options.logger, metrics: options.metrics };
  const byPath = new Map<string, RpcRoute[]>();
  for (const route of options.routes) byPath.set(route.path, [...(byPath.get(route.path) ?? []), route]);

  return (req: NodeRequest, res: NodeResponse): void => {
    const requestId = createRequestId();
    void handle(req, res, requestId).catch((err: unknown) => {
      options.logger.error("gateway failure", { request_id: requestId, error: err instanceof Error ? err : String(err) });
      sendError(res, toPublicError(err, requestId), { "x-request-id": requestId });
    });
  };

  async function handle(req: NodeRequest, res: NodeResponse, requestId: string): Promise<void> {
    const path = (req.url ?? "/").split("?")[0]!;
    if (path === "/healthz" || path === "/readyz") {
      if (req.method !== "GET") return refuse(req, res, requestId, path, methodNotAllowed(path, "GET"), { allow: "GET" });
      const decisions = options.decisionsStatus ? { decisions: options.decisionsStatus() } : {};
      if (path === "/healthz") return sendOk(res, { status: "up", ...decisions }, { "x-request-id": requestId });
      const ready = await options.isReady().catch(() => false);
      if (ready) return sendOk(res, { status: "ready", ...decisions }, { "x-request-id": requestId });
      const notReady = apiError("UNAVAILABLE", "not ready: the database is unreachable");
      return sendError(res, toPublicError(notReady, requestId), { "x-request-id": requestId });
    }
    if (path === "/metrics" && options.metrics) {
      if (req.method !== "GET") return refuse(req, res, requestId, path, methodNotAllowed(path, "GET"), { allow: "GET" });
      return sendMetrics(res, options.metrics, requestId);
    }
    if (path === OPENAPI_PATH && options.openApiDocument !== undefined) {
      if (req.method !== "GET") return refuse(req, res, requestId, path, methodNotAllowed(path, "GET"), { allow: "GET" });
      res.writeHead(200, { "content-type": "application/json; charset=utf-8", "cache-control": "public, max-age=300", "x-request-id": requestId });
      return void res.end(options.openApiDocument);
    }
    const candidates = byPath.get(path);
    if (!candidates) {
      return refuse(req, res, requestId, path, apiError("NOT_FOUND", `no such path: ${req.method} ${path}`));
    }
    const route = candidates.find((r) => r.httpMethod === req.method);
    if (!route) {
      const allow = candidates.map((r) => r.httpMethod).join(", ");
      return refuse(req, res, requestId, path, methodNotAllowed(path, allow), { allow });
    }
    await serveRpc(route, req, res, requestId);
  }

  /** A 404 or 405: logged and given a request id like every other call; the body is never read. */
  async function refuse(
    req: NodeRequest,
    res: NodeResponse,
    requestId: string,
    path: string,
    error: Error,
    headers: Record<string, string> = {},
  ): Promise<void> {
    const procedure = path.length > MAX_LOGGED_PATH_CHARS ? `${path.slice(0, MAX_LOGGED_PATH_CHARS)}…` : path;
    try {
      await observeCall(observer, { requestId, procedure, protocol: "gateway" }, () => Promise.reject(error));
    } catch (err) {
      drainNodeBody(req, res, options.maxBodyBytes);
      sendError(res, err, { ...headers, "x-request-id": requestId });
    }
  }

  async function serveRpc(route: RpcRoute, req: NodeRequest, res: NodeResponse, requestId: string): Promise<void> {
    const started = performance.now();
    const phases: CallPhases = {};
    const requestAbort = new AbortController();
    // At the end of a shutdown's grace period, calls still running are cut off (503, holds released).
    const onShutdown = () => requestAbort.abort(new Error("server shutting down"));
    options.shutdownSignal?.addEventListener("abort", onShutdown, { once: true });
    res.on("close", () => {
      options.shutdownSignal?.removeEventListener("abort", onShutdown);
      if (!res.writableFinished) requestAbort.abort(new Error("client closed the connection"));
    });
    const ctx = createHandlerContext({
      service: route.method.parent,
      method: route.method,
      protocolName: "gateway",
      requestMethod: req.method ?? "POST",
      url: requestUrl(req),
      requestHeader: requestHeaders(req),
      requestSignal: requestAbort.signal,
      contextValues: createContextValues().set(kRequestId, requestId).set(kCallPhases, phases).set(kRemoteAddress, req.socket?.remoteAddress ?? ""),
    });
    const procedure = `/${route.method.parent.typeName}/${route.method.name}`;
    try {
      const data = await observeCall(observer, { requestId, procedure, protocol: "gateway", phases }, async () => {
        await route.door(ctx);
        const request = route.httpMethod === "POST" ? await parseBody(route, req, res) : parseQuery(route.method.input, req.url ?? "");
        const output = create(route.method.output, await route.impl(request, ctx));
        const json = toJson(route.method.output, output, { useProtoFieldName: true, alwaysEmitImplicit: true }) as Record<string, unknown>;
        route.reshapeAnswerJson?.(json);
        return json;
      });
      sendEnvelope(res, 200, { code: 0, message: "ok", data }, responseHeaders(ctx, requestId, phases, started));
    } catch (err) {
      if (req.readableFlowing === null) drainNodeBody(req, res, options.maxBodyBytes);
      const headers = responseHeaders(ctx, requestId, phases, started);
      // A 415 for the body's encoding lists the accepted ones (RFC 9110, Accept-Encoding in a response).
      if (describeError(err).reason === "UNSUPPORTED_ENCODING") headers["accept-encoding"] = ACCEPTED_ENCODING_NAMES;
      sendError(res, err, headers);
    }
  }

  async function parseBody(route: RpcRoute, req: NodeRequest, res: NodeResponse): Promise<MessageShape<DescMessage>> {
    const contentType = req.headers["content-type"];
    if (contentType === undefined || !/^application\/json\s*(;|$)/i.test(contentType)) {
      throw apiError("UNSUPPORTED_MEDIA_TYPE", "content-type: must be application/json", {
        field: "content-type",
        rule: "must be application/json",
      });
    }
    const encoding = req.headers["content-encoding"];
    const compression = compressionNamed(encoding);
    if (compression === undefined) throw unsupportedEncoding(String(encoding), "content-encoding", "accept-encoding");
    let body: Uint8Array = await readNodeBody(req, res, options.maxBodyBytes);
    if (compression !== null) {
      const decompressed = await decompressBody(compression, body, options.maxBodyBytes);
      if (!(decompressed instanceof Uint8Array)) throw decompressed;
      body = decompressed;
    }
    return decodeJsonRequest(route.method.input, parseJsonBody(body));
  }
}

const MAX_LOGGED_PATH_CHARS = 200;

/** The Prometheus text exposition of the process's metrics; no key, nothing about accounts. */
async function sendMetrics(res: NodeResponse, metrics: Metrics, requestId: string): Promise<void> {
  const text = await metrics.registry.metrics();
  res.writeHead(200, { "content-type": metrics.registry.contentType, "x-request-id": requestId });
  res.end(text);
}

/**
 * A GET's request message from its query string: each parameter named as a
 * field of the message (snake_case or its JSON name) is that field's value
 * in proto JSON ("10" is an int32 there); other parameters are ignored, as
 * before GETs read any. A parameter given twice, or a value the field cannot
 * hold, is a 400 naming it.
 */
export function parseQuery(schema: DescMessage, url: string): MessageShape<DescMessage> {
  const query = new URLSearchParams(url.includes("?") ? url.slice(url.indexOf("?") + 1) : "");
  const json: Record<string, string> = {};
  for (const field of schema.fields) {
    if (field.fieldKind !== "scalar" && field.fieldKind !== "enum") continue;
    for (const name of new Set([field.name, field.jsonName])) {
      const values = query.getAll(name);
      if (values.length === 0) continue;
      throwIfInvalid(values.length > 1 || field.name in json ? [{ field: field.name, rule: "given once" }] : []);
      json[field.name] = values[0]!;
    }
  }
  try {
    return fromJson(schema, json);
  } catch (err) {
    const field = Object.keys(json).find((name) => String(err).includes(name)) ?? "query";
    throw apiError("INVALID_ARGUMENT", `${field}: not a value this parameter takes`, { field, rule: "a value of the field's type", cause: err });
  }
}

/**
 * The URL a call was sent to, with its host as connect-node's handler contexts
 * have it (Host, or HTTP/2's :authority), so doors that compare the host see
 * it on both surfaces; only the path when neither is there.
 */
function requestUrl(req: NodeRequest): string {
  const path = req.url ?? "";
  const host = req.headers.host ?? req.headers[":authority"];
  return typeof host === "string" && host !== "" ? `http://${host}${path}` : path;
}

function methodNotAllowed(path: string, allow: string): Error {
  return apiError("METHOD_NOT_ALLOWED", `${path} accepts ${allow}`, { metadata: { allow } });
}

function responseHeaders(ctx: HandlerContext, requestId: string, phases: CallPhases, started: number): Record<string, string> {
  return { "x-request-id": requestId, "server-timing": serverTimingHeader(phases, performance.now() - started), ...headerRecord(ctx.responseHeader) };
}
