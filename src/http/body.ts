import type http from "node:http";
import http2 from "node:http2";
import type net from "node:net";
import type { ConnectError } from "@connectrpc/connect";
import { apiError } from "../errors.js";

/**
 * How much of a refused body is still read and thrown away, as a multiple of
 * the body limit, before the connection or stream is dropped instead: reading
 * it keeps a keep-alive connection usable and lets the answer reach a client
 * that is still sending; the bound stops a caller who never stops.
 */
const DRAIN_LIMIT_FACTOR = 16;

/**
 * How long a connection closed while its client may still be sending keeps
 * reading and discarding, after its answer and its FIN, before it is dropped
 * (nginx's lingering_timeout has the same default).
 */
const LINGER_TIMEOUT_MS = 5_000;

/** A request as Node's HTTP/1.1 and HTTP/2 servers give it. */
export type NodeRequest = http.IncomingMessage | http2.Http2ServerRequest;
/** What the drain needs of a response: whether it is out, and when it will be. */
export interface NodeResponse {
  readonly writableFinished: boolean;
  once(event: "finish", listener: () => void): unknown;
}

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
export function readNodeBody(req: NodeRequest, res: NodeResponse, maxBytes: number): Promise<Buffer> {
  const declared = Number(req.headers["content-length"] ?? NaN);
  if (declared > maxBytes) {
    drainNodeBody(req, res, maxBytes);
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
      drainNodeBody(req, res, maxBytes);
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
 * stream), and so a client still sending reads its answer instead of a write
 * error. Past the drain limit the body is abandoned, and what still arrives
 * until the connection or stream is gone is discarded too: a socket closed
 * with unread bytes is reset, and a reset can take the answer with it.
 */
export function drainBody(chunks: AsyncIterator<Uint8Array>, maxBodyBytes: number, abandon: () => void): void {
  void (async () => {
    let drained = 0;
    let abandoned = false;
    for (;;) {
      const next = await chunks.next();
      if (next.done) return;
      drained += next.value.byteLength;
      if (!abandoned && drained > DRAIN_LIMIT_FACTOR * maxBodyBytes) {
        abandoned = true;
        abandon();
      }
    }
  })().catch(() => undefined);
}

/** drainBody for a Node request whose body was not read (or not to the end). */
export function drainNodeBody(req: NodeRequest, res: NodeResponse, maxBodyBytes: number): void {
  req.on("error", () => {});
  drainBody((req as AsyncIterable<Uint8Array>)[Symbol.asyncIterator](), maxBodyBytes, () => abandonNodeBody(req, res));
}

/**
 * Ends a request body nobody will read, once the answer is out: HTTP/2
 * resets the stream with NO_ERROR (RFC 9113 §8.1), HTTP/1.1 closes the
 * connection lingering.
 */
export function abandonNodeBody(req: NodeRequest, res: NodeResponse): void {
  const abandon = () => {
    if ("stream" in req) req.stream.close(http2.constants.NGHTTP2_NO_ERROR);
    else closeLingering(req.socket);
  };
  if (res.writableFinished) abandon();
  else res.once("finish", abandon);
}

/**
 * Closes an HTTP/1.1 connection whose client may still be sending, as
 * nginx's lingering close does (RFC 9112 §9.6): the answer already written
 * goes first, then our FIN, and what still arrives is read and discarded for
 * a while, so the client's stack never meets a reset before the client has
 * read the answer; a client that keeps sending past that is dropped.
 */
export function closeLingering(socket: net.Socket): void {
  if (socket.destroyed || socket.writableEnded) return;
  const drop = setTimeout(() => socket.destroy(), LINGER_TIMEOUT_MS).unref();
  socket.once("close", () => clearTimeout(drop));
  // Once the client has sent its FIN too, nothing is left to read.
  socket.once("end", () => socket.destroy());
  socket.end();
}
