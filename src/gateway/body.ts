import { ConnectError } from "@connectrpc/connect";
import type { NodeRequest } from "./envelope.js";
import { apiError } from "../errors.js";

/**
 * Reads a request body up to maxBytes. An oversized body is refused before it
 * is parsed: at once from Content-Length, or as soon as a chunked body crosses
 * the limit (the rest is drained, up to a bound, so the 413 reaches the client).
 */
export async function readBody(req: NodeRequest, maxBytes: number): Promise<Buffer> {
  const declared = Number(req.headers["content-length"] ?? NaN);
  if (declared > maxBytes) {
    discardBody(req, maxBytes);
    throw tooLarge(maxBytes);
  }
  const chunks: Buffer[] = [];
  let total = 0;
  try {
    for await (const chunk of req as AsyncIterable<Buffer>) {
      total += chunk.length;
      if (total > maxBytes) {
        discardBody(req, maxBytes);
        throw tooLarge(maxBytes);
      }
      chunks.push(chunk);
    }
  } catch (err) {
    // The stream fails only when the caller went away mid-body ("aborted", ECONNRESET): not a server fault.
    if (req.destroyed && !(err instanceof ConnectError)) {
      throw apiError("CANCELLED", "the caller closed the connection before the body arrived", { cause: err });
    }
    throw err;
  }
  return Buffer.concat(chunks, total);
}

function tooLarge(maxBytes: number) {
  return apiError("PAYLOAD_TOO_LARGE", `body: must be at most ${maxBytes / 1024} KB`, {
    field: "body",
    rule: `at most ${maxBytes} bytes`,
    metadata: { max_bytes: String(maxBytes) },
  });
}

/**
 * Discards up to 16 × maxBytes more of the body, then drops the connection:
 * for answers sent before (or instead of) reading a body, so an unread body
 * cannot keep the connection busy without bound.
 */
export function discardBody(req: NodeRequest, maxBytes: number): void {
  let discarded = 0;
  req.on("data", (chunk: Buffer) => {
    discarded += chunk.length;
    if (discarded > 16 * maxBytes) req.destroy();
  });
  req.on("error", () => {});
  req.resume();
}
