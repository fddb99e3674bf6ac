import { createContextKey, type HandlerContext } from "@connectrpc/connect";
import { createRequestId } from "./request-id.js";

/** The id of one call, shared by the log line, the error detail and the billing record. */
export const kRequestId = createContextKey<string>("", { description: "request id" });

/**
 * The address of the peer the call came over (the socket's, never a header a
 * caller could write): the account area bounds password work per client by it.
 */
export const kRemoteAddress = createContextKey<string>("", { description: "remote address" });

/** The call's request id, created on first use. */
export function requestIdOf(ctx: HandlerContext): string {
  let id = ctx.values.get(kRequestId);
  if (!id) {
    id = createRequestId();
    ctx.values.set(kRequestId, id);
  }
  return id;
}
