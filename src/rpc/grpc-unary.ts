import type http from "node:http";
import type http2 from "node:http2";
import { fromBinary, toBinary, type DescService } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  createHandlerContext,
  createServiceImplSpec,
  type ConnectRouter,
  type HandlerContext,
  type Interceptor,
  type MethodImplSpec,
} from "@connectrpc/connect";
import { compressedFlag, compressionNegotiate, encodeEnvelope, invokeUnaryImplementation, type Compression } from "@connectrpc/connect/protocol";
import { setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import type { universalRequestFromNodeRequest } from "@connectrpc/connect-node";
import { RECURSION_LIMIT, type GatedBody } from "./body-gate.js";
import { grpcTimeoutMs } from "./grpc-timeout.js";
import { headerRecord, requestHeaders } from "../http/node-headers.js";

type UniversalRequest = ReturnType<typeof universalRequestFromNodeRequest>;
type UnarySpec = Extract<MethodImplSpec, { kind: "unary" }>;

/** The reason a finished call's signal is aborted with; nothing listens by then. */
const CALL_ENDED = new ConnectError("the call has ended", Code.Canceled);

/** Connect's default: smaller messages are not worth compressing (limit-io.js). */
const COMPRESS_MIN_BYTES = 1024;

/**
 * Unary binary gRPC over HTTP/2, the call every generated client makes,
 * served without Connect's streaming pipeline. Connect's gRPC handler runs a
 * unary call through the machinery of a bidirectional stream (a chain of
 * async iterables for one message each way), which cost as much CPU per call
 * as the rest of a metered decision. This path does what that handler does,
 * with Connect's own parts: the same handler context (deadline from
 * grpc-timeout, the caller's and the shutdown's signals), the same
 * interceptors and implementation (invokeUnaryImplementation), the same
 * response compression negotiation and trailer status (setTrailerStatus).
 * Everything else (gRPC-Web, Connect, JSON codecs, compressed requests,
 * streaming methods) stays on Connect's handler. Whatever is wrong with a
 * request (its frame, flag, encoding, deadline or message) the body gate has
 * already answered the same way for both. Those parts are exported by
 * @connectrpc/connect but marked internal (no semver promise): the version is
 * pinned, and test/rpc/grpc-unary.test.ts and the fuzz suite send each call
 * both ways and fail on any difference after an upgrade.
 */
export interface GrpcUnaryPath {
  /** Registers services on the router as usual and remembers their unary implementations. */
  recording(router: ConnectRouter): ConnectRouter;
  /** True when this path serves `req` (then its universal request comes from `requestOf`). */
  serves(requestPath: string, req: http.IncomingMessage | http2.Http2ServerRequest): req is http2.Http2ServerRequest;
  /** The call as Connect's handlers see it, for the body gate and then `serve`. */
  requestOf(req: http2.Http2ServerRequest, res: http2.Http2ServerResponse): UniversalRequest;
  /** Answers the call on `res`, once the body gate has read and checked its body. Never throws for the call's own errors: they go out as gRPC trailers. */
  serve(requestPath: string, request: UniversalRequest, body: GatedBody, res: http2.Http2ServerResponse): Promise<void>;
}

export interface GrpcUnaryOptions {
  interceptors: Interceptor[];
  acceptCompression: Compression[];
  shutdownSignal: AbortSignal;
}

export function createGrpcUnaryPath(options: GrpcUnaryOptions): GrpcUnaryPath {
  const specs = new Map<string, UnarySpec>();

  function remember(service: DescService, implementation: object): void {
    const serviceSpec = createServiceImplSpec(service, implementation);
    for (const spec of Object.values(serviceSpec.methods)) {
      if (spec.kind === "unary") specs.set(`/${service.typeName}/${spec.method.name}`, spec);
    }
  }

  return {
    recording(router) {
      const recorder: ConnectRouter = {
        get handlers() {
          return router.handlers;
        },
        service(service, implementation, handlerOptions) {
          // Per-service handler options would change Connect's behaviour for it; such a service stays on Connect.
          if (handlerOptions === undefined) remember(service, implementation);
          router.service(service, implementation, handlerOptions);
          return recorder;
        },
        rpc(method, implementation, handlerOptions) {
          router.rpc(method, implementation, handlerOptions);
          return recorder;
        },
      };
      return recorder;
    },

    serves(requestPath, req): req is http2.Http2ServerRequest {
      if (!("stream" in req) || req.method !== "POST" || !specs.has(requestPath)) return false;
      const contentType = req.headers["content-type"];
      if (contentType !== "application/grpc" && contentType !== "application/grpc+proto") return false;
      const encoding = req.headers["grpc-encoding"];
      return encoding === undefined || encoding === "identity";
    },

    requestOf(req, res) {
      // connect-node's universalRequestFromNodeRequest aborts the signal whenever the stream closes, building a
      // DOMException per call; here it is aborted only when the caller leaves before the answer started (this
      // path writes its headers only once the call is done; a closed stream counts as finished in Node's compat API).
      const controller = new AbortController();
      req.once("close", () => {
        if (!res.headersSent) controller.abort(new ConnectError(`the caller closed the stream (HTTP/2 code ${req.stream.rstCode})`, Code.Canceled));
      });
      return {
        httpVersion: req.httpVersion,
        method: req.method,
        url: `http://${req.authority}${req.url}`,
        header: requestHeaders(req),
        // The request is a Readable, itself an async iterable of its chunks.
        body: req,
        signal: controller.signal,
      };
    },

    async serve(requestPath, request, body, res) {
      const spec = specs.get(requestPath)!;
      const context = createHandlerContext({
        ...spec,
        service: spec.method.parent,
        protocolName: "grpc",
        requestMethod: request.method,
        url: request.url,
        // The gate left only a deadline a timer can hold (or none).
        timeoutMs: grpcTimeoutMs(request.header.get("grpc-timeout")),
        shutdownSignal: options.shutdownSignal,
        requestSignal: request.signal,
        requestHeader: request.header,
        contextValues: request.contextValues,
        responseHeader: { "content-type": "application/grpc+proto" },
        responseTrailer: { "grpc-status": "0" },
      });
      const compression = compressionNegotiate(options.acceptCompression, null, request.header.get("grpc-accept-encoding"), "grpc-accept-encoding");
      if (compression.response) context.responseHeader.set("grpc-encoding", compression.response.name);
      let frame: Uint8Array | undefined;
      try {
        // The gate decoded the message when it checked it; a refused body was replaced by an empty one.
        const input = body.decoded ?? fromBinary(spec.method.input, body.bytes.subarray(5), { recursionLimit: RECURSION_LIMIT });
        const output = await invokeUnaryImplementation(spec, context, input, options.interceptors);
        frame = await envelope(toBinary(spec.method.output, output), compression.response);
      } catch (err) {
        setTrailerStatus(context.responseTrailer, err instanceof ConnectError ? err : new ConnectError("internal error", Code.Internal, undefined, undefined, err));
      } finally {
        // As Connect's handler does when a call ends: frees the deadline timer and the signal listeners
        // (with a reason of ours: an abort without one builds a DOMException, a stack trace, per call).
        context.abort(CALL_ENDED);
      }
      respond(res, context, frame);
    },
  };
}

/** The gRPC length-prefixed message, compressed as Connect's transformCompressEnvelope does. */
async function envelope(message: Uint8Array, compression: Compression | null): Promise<Uint8Array> {
  if (compression === null || message.byteLength < COMPRESS_MIN_BYTES) return encodeEnvelope(0, message);
  return encodeEnvelope(compressedFlag, await compression.compress(message));
}

/**
 * Headers, the message if there is one, then the trailers with the status:
 * what Connect's node adapter writes. A caller that has gone is not waited
 * for (its stream is closed; there is nobody to tell).
 */
function respond(res: http2.Http2ServerResponse, context: HandlerContext, frame: Uint8Array | undefined): void {
  if (res.stream.closed) return;
  res.writeHead(200, headerRecord(context.responseHeader));
  if (frame) res.write(frame);
  res.addTrailers(headerRecord(context.responseTrailer));
  res.end();
}
