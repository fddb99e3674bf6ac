import type http from "node:http";
import http2 from "node:http2";
import { Code, ConnectError, createConnectRouter, createContextValues, type ConnectRouter, type Interceptor } from "@connectrpc/connect";
import { errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import { universalRequestFromNodeRequest, universalResponseToNodeResponse } from "@connectrpc/connect-node";
import { REASONS, describeError } from "../errors.js";
import type { Logger } from "../logger.js";
import { abandonNodeBody } from "../http/body.js";
import { ACCEPTED_COMPRESSIONS } from "../http/compression.js";
import { createRequestId } from "../call/request-id.js";
import { gateBody, gatedBody, isPayloadTooLarge, RECURSION_LIMIT, type BodyGateOptions } from "./body-gate.js";
import { createGrpcUnaryPath } from "./grpc-unary.js";
import { kRemoteAddress } from "../call/context.js";
import { observeCall, type CallObserver } from "../call/observe.js";

type NodeRequest = http.IncomingMessage | http2.Http2ServerRequest;
type NodeResponse = http.ServerResponse | http2.Http2ServerResponse;

export interface RpcHandlerOptions extends BodyGateOptions {
  routes: (router: ConnectRouter) => void;
  /** Every path the router does not serve (the JSON gateway). */
  fallback: (req: NodeRequest, res: NodeResponse) => void;
  interceptors: Interceptor[];
  shutdownSignal: AbortSignal;
  logger: Logger;
  /** Serve unary binary gRPC over HTTP/2 on the short path (grpc-unary.ts); off sends every call through Connect's handler. Default on. */
  grpcShortPath?: boolean;
}

/**
 * connect-node's adapter with the body gate in front of each unary method
 * (body-gate.ts): Connect parses a request before any interceptor runs and
 * reports a body it cannot decode as INTERNAL, so the gate reads and checks
 * the body first. Unary binary gRPC over HTTP/2 then takes a shorter path
 * (grpc-unary.ts). Otherwise the same as connectNodeAdapter: one universal
 * handler per RPC path, the same encodings accepted as the gate decompresses.
 */
export function createRpcHandler(options: RpcHandlerOptions): (req: NodeRequest, res: NodeResponse) => void {
  const acceptCompression = [...ACCEPTED_COMPRESSIONS];
  const observer: CallObserver = { logger: options.logger };
  const router = createConnectRouter({
    interceptors: options.interceptors,
    // The gate enforces the contract's limit with a typed error, before and after decompression; this is a backstop.
    readMaxBytes: 16 * options.maxBodyBytes,
    // Connect ignores unknown JSON fields by default; the contract rejects them on every surface.
    jsonOptions: { ignoreUnknownFields: false },
    binaryOptions: { recursionLimit: RECURSION_LIMIT },
    acceptCompression,
    shutdownSignal: options.shutdownSignal,
  });
  const grpcUnary = createGrpcUnaryPath({ interceptors: options.interceptors, acceptCompression, shutdownSignal: options.shutdownSignal });
  options.routes(options.grpcShortPath === false ? router : grpcUnary.recording(router));
  const handlers = new Map(router.handlers.map((handler) => [handler.requestPath, handler]));

  return (req, res) => {
    const handler = handlers.get((req.url ?? "").split("?", 1)[0]!);
    if (!handler) return options.fallback(req, res);
    const short = grpcUnary.serves(handler.requestPath, req);
    const contextValues = createContextValues().set(kRemoteAddress, req.socket?.remoteAddress ?? "");
    const request = short
      ? { ...grpcUnary.requestOf(req, res as http2.Http2ServerResponse), contextValues }
      : universalRequestFromNodeRequest(req as http.IncomingMessage, res as http.ServerResponse, undefined, contextValues);
    gateBody(handler.method, request, options, () => abandonNodeBody(req, res))
      .then(async (gated) => {
        if (gated instanceof ConnectError) return refuseOutsideProtocol(observer, handler.requestPath, gated, res);
        const body = short ? gatedBody(gated) : undefined;
        if (body) return grpcUnary.serve(handler.requestPath, gated, body, res as http2.Http2ServerResponse);
        const response = await handler(gated);
        // The Connect protocol maps RESOURCE_EXHAUSTED to 429; an oversized body is a 413 like on the gateway.
        if (isPayloadTooLarge(gated) && response.status === 429) response.status = 413;
        await universalResponseToNodeResponse(response, res);
      })
      .catch((err: unknown) => {
        options.logger.warn("rpc handler failed", { procedure: handler.requestPath, error: err instanceof Error ? err.message : String(err) });
        if (res.headersSent) return void res.end();
        // Nothing answered yet: Connect's error JSON, which every client reads, without the failure's text.
        const body = errorToJsonBytes(new ConnectError("internal error", Code.Internal), {});
        res.writeHead(500, { "content-type": "application/json", "content-length": String(body.byteLength) });
        res.end(body);
      });
  };
}

/**
 * Answers a request no protocol serves (its content type names none) with
 * the reason's HTTP status and Connect's error JSON, the one error format a
 * plain HTTP client can read too; logged and given a request id like any call.
 */
async function refuseOutsideProtocol(observer: CallObserver, procedure: string, error: ConnectError, res: NodeResponse): Promise<void> {
  const requestId = createRequestId();
  const publicError = await observeCall(observer, { requestId, procedure, protocol: "unknown" }, () => Promise.reject(error)).catch((err: ConnectError) => err);
  const body = errorToJsonBytes(publicError, {});
  res.writeHead(REASONS[describeError(publicError).reason].http, {
    "content-type": "application/json",
    "content-length": String(body.byteLength),
    "x-request-id": requestId,
  });
  res.end(body);
}
