import type { NodeRequest } from "./envelope.js";
import { apiError } from "../errors.js";

/**
 * Reads a request body up to maxBytes. An oversized body is refused before it
 * is parsed: at once from Content-Length, or as soon as a chunked body crosses
 * the limit (the rest is drained, up to a bound, so the 413 reaches the client).
 */
export function readBody(req: NodeRequest, maxBytes: number): Promise<Buffer> {
  const declared = Number(req.headers["content-length"] ?? NaN);
  if (declared > maxBytes) {
    discardBody(req, maxBytes);
    return Promise.reject(tooLarge(maxBytes));
  }
  // Events, not `for await`: leaving an async iterator early destroys the stream, and the
  // caller would see a reset instead of its 413.
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let total = 0;
    const done = () => {
      req.off("data", onData);
      req.off("end", onEnd);
      req.off("close", onClose);
    };
    const onData = (chunk: Buffer) => {
      total += chunk.length;
      if (total <= maxBytes) return void chunks.push(chunk);
      done();
      discardBody(req, maxBytes);
      reject(tooLarge(maxBytes));
    };
    const onEnd = () => {
      done();
      resolve(Buffer.concat(chunks, total));
    };
    // Closed before the end of the body: the caller went away, which is not a server fault.
    const onClose = () => {
      done();
      reject(apiError("CANCELLED", "the caller closed the connection before the body arrived"));
    };
    req.on("data", onData);
    req.on("end", onEnd);
    req.on("close", onClose);
    req.on("error", () => {});
  });
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
