import { ConnectError, type Interceptor } from "@connectrpc/connect";
import { REASONS, describeError, toPublicError } from "../errors.js";
import { withStack, type Logger } from "../logger.js";
import type { Metrics } from "../metrics.js";
import { kCallPhases, phaseLogFields, type CallPhases } from "./call-phases.js";
import { kRequestId, kRequestProblem } from "./context.js";
import { createRequestId } from "./request-id.js";

/** Where a call's log line and its metrics go. */
export interface CallObserver {
  logger: Logger;
  metrics?: Pick<Metrics, "recordCall">;
}

/**
 * Logs one line per call and makes every error safe to return: unknown
 * errors become a fixed INTERNAL message carrying the request id, and their
 * real cause goes only to the log. The gateway runs the same function, so
 * both surfaces log and hide errors alike.
 */
export async function observeCall<T>(
  { logger, metrics }: CallObserver,
  call: { requestId: string; procedure: string; protocol: string; phases?: CallPhases },
  run: () => Promise<T>,
): Promise<T> {
  const started = performance.now();
  const fields = () => ({
    request_id: call.requestId,
    procedure: call.procedure,
    protocol: call.protocol,
    duration_ms: Math.round((performance.now() - started) * 10) / 10,
    ...phaseLogFields(call.phases),
  });
  const record = (reason: string) => metrics?.recordCall(call.procedure, call.protocol, reason, (performance.now() - started) / 1000);
  try {
    const result = await run();
    record("OK");
    logger.info("call", { ...fields(), status: "ok" });
    return result;
  } catch (err) {
    const { reason } = describeError(err);
    record(reason);
    const publicError = toPublicError(err, call.requestId);
    const entry = { ...fields(), status: "error", reason };
    if (REASONS[reason].http >= 500) {
      logger.error("call", { ...entry, error: reason === "INTERNAL" ? withStack(err) : err instanceof Error ? err : String(err) });
    } else {
      logger.info("call", entry);
    }
    throw publicError;
  }
}

/** The Connect/gRPC/gRPC-Web side of observeCall. Streaming calls (reflection, health watch) pass through. */
export function createObserveInterceptor(observer: CallObserver): Interceptor {
  return (next) => async (req) => {
    if (req.stream) return next(req);
    let requestId = req.contextValues.get(kRequestId);
    if (!requestId) {
      requestId = createRequestId();
      req.contextValues.set(kRequestId, requestId);
    }
    const id = requestId;
    const requestProblem = req.contextValues.get(kRequestProblem);
    const phases: CallPhases = {};
    req.contextValues.set(kCallPhases, phases);
    try {
      const res = await observeCall(
        observer,
        {
          requestId,
          procedure: req.url.slice(req.url.lastIndexOf("/", req.url.lastIndexOf("/") - 1)),
          protocol: req.header.get("content-type") ?? "",
          phases,
        },
        () => (requestProblem ? Promise.reject(requestProblem) : next(req)),
      );
      res.header.set("x-request-id", id);
      return res;
    } catch (err) {
      // Connect sends error metadata as response headers (gRPC: trailers), so every answer names its request.
      if (err instanceof ConnectError) {
        // A problem the gate found may carry headers its protocol asks for (the accepted encodings).
        requestProblem?.metadata.forEach((value, name) => err.metadata.set(name, value));
        err.metadata.set("x-request-id", id);
      }
      throw err;
    }
  };
}
