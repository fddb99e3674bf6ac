import type http from "node:http";
import type http2 from "node:http2";
import type { ConnectError } from "@connectrpc/connect";
import { apiError } from "../errors.js";

/**
 * How much of a refused body is still read and thrown away, as a multiple of
 * the body limit, before the connection or stream is dropped instead: reading
 * it keeps a keep-alive connection usable and lets the answer reach a client
 * that is still sending; the bound stops a caller who never stops.
 */
const DRAIN_LIMIT_FACTOR = 16;

/** A request as Node's HTTP/1.1 and HTTP/2 servers give it. */
export type NodeRequest = http.IncomingMessage | http2.Http2ServerRequest;

/** The one error for a body over the limit, on every door (the limit is stated in KB and bytes). */
export function payloadTooLarge(maxBytes: number): ConnectError {
  return apiError("PAYLOAD_TOO_LARGE", `body: must be at most ${maxBytes / 1024} KB`, {
    field: "body",
    rule: `at most ${maxBytes} bytes`,
    metadata: { max_bytes: String(maxBytes) },
  });
}

/** The one error for a caller that closed its connection before its body arrived: not a server fault. */
export function bodyCancelled(): ConnectError {
  return apiError("CANCELLED", "the caller closed the connection before the body arrived");
}

/**
 * Reads a body whole from its chunks, or returns undefined as soon as it
 * passes `limitBytes` (the rest is then drained, never held). The iterator is
 * never left early: leaving a Node stream's iterator destroys the stream, and
 * the caller would see a reset instead of its answer.
 */
export async function readBodyUpTo(
  chunks: AsyncIterator<Uint8Array>,
  limitBytes: number,
  maxBodyBytes: number,
  abandon: () => void,
): Promise<Uint8Array | undefined> {
  const read: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const next = await chunks.next();
    if (next.done) break;
    total += next.value.byteLength;
    if (total > limitBytes) {
      drainBody(chunks, maxBodyBytes, abandon);
      return undefined;
    }
    read.push(next.value);
  }
  return read.length === 1 ? read[0]! : Buffer.concat(read, total);
}

/**
 * Reads a Node request's body up to maxBytes with events (the cheapest way
 * for the small bodies most calls send). An oversized body is refused before
 * it is parsed: at once from Content-Length, or as soon as a chunked body
 * crosses the limit; the rest is drained so the answer reaches the client.
 */
export function readNodeBody(req: NodeRequest, maxBytes: number): Promise<Buffer> {
  const declared = Number(req.headers["content-length"] ?? NaN);
  if (declared > maxBytes) {
    drainNodeBody(req, maxBytes);
    return Promise.reject(payloadTooLarge(maxBytes));
  }
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
      drainNodeBody(req, maxBytes);
      reject(payloadTooLarge(maxBytes));
    };
    const onEnd = () => {
      done();
      resolve(Buffer.concat(chunks, total));
    };
    const onClose = () => {
      done();
      reject(bodyCancelled());
    };
    req.on("data", onData);
    req.on("end", onEnd);
    req.on("close", onClose);
    req.on("error", () => {});
  });
}

/**
 * Reads and discards the rest of a body nobody will use, so it occupies
 * neither an HTTP/1.1 connection nor an HTTP/2 session's flow-control window
 * (refused bodies left unread there end in ENHANCE_YOUR_CALM for every later
 * stream); past the drain limit the body is abandoned instead.
 */
export function drainBody(chunks: AsyncIterator<Uint8Array>, maxBodyBytes: number, abandon: () => void): void {
  void (async () => {
    let drained = 0;
    for (;;) {
      const next = await chunks.next();
      if (next.done) return;
      drained += next.value.byteLength;
      if (drained > DRAIN_LIMIT_FACTOR * maxBodyBytes) return abandon();
    }
  })().catch(() => undefined);
}

/** drainBody for a Node request whose body was not read (or not to the end): past the drain limit the connection is dropped. */
export function drainNodeBody(req: NodeRequest, maxBodyBytes: number): void {
  req.on("error", () => {});
  drainBody((req as AsyncIterable<Uint8Array>)[Symbol.asyncIterator](), maxBodyBytes, () => req.destroy());
}
