import { createContextKey, type ConnectError, type HandlerContext } from "@connectrpc/connect";
import { createRequestId } from "./request-id.js";

/** The id of one call, shared by the log line, the error detail and the billing record. */
export const kRequestId = createContextKey<string>("", { description: "request id" });

/**
 * The address of the peer the call came over (the socket's, never a header a
 * caller could write): the account area bounds password work per client by it.
 */
export const kRemoteAddress = createContextKey<string>("", { description: "remote address" });

/**
 * The problem the body gate (rpc/body-gate.ts) found with a request, raised by the observe
 * interceptor so it travels like every other error (typed detail, log line,
 * the protocol's own error format).
 */
export const kRequestProblem = createContextKey<ConnectError | undefined>(undefined, { description: "request problem found by the body gate" });

/** The call's request id, created on first use. */
export function requestIdOf(ctx: HandlerContext): string {
  let id = ctx.values.get(kRequestId);
  if (!id) {
    id = createRequestId();
    ctx.values.set(kRequestId, id);
  }
  return id;
}
