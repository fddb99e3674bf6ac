import type http from "node:http";
import http2 from "node:http2";
import type net from "node:net";
import type { ConnectionLimits } from "./config.js";
import type { ConnectionTimeout } from "./metrics.js";
import { closeLingering } from "./http/body.js";

/** Sent when a request head does not arrive in time, as Node's own headersTimeout and nginx answer. */
const REQUEST_TIMEOUT_ANSWER = "HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/** The timeouts a guard enforces; the cap is the front server's. */
export type ConnectionTimeouts = Omit<ConnectionLimits, "maxConnections">;

/** The timers of one client connection, driven by what the HTTP server it was handed to reports. */
export interface ConnectionGuard {
  /** The connection speaks HTTP/1.1: its requests drive the timers from now on. */
  http1(): void;
  /** An HTTP/1.1 request head has arrived on this connection. */
  request(req: http.IncomingMessage, res: http.ServerResponse): void;
  /** The connection speaks HTTP/2: its streams drive the timers from now on. */
  session(session: http2.ServerHttp2Session): void;
  /** Shutdown: a connection not on HTTP/2 closes now if nothing is in progress, else after its last answer. */
  drain(): void;
}

/**
 * Bounds what one connection may hold without making progress. Node's
 * http server only enforces its headersTimeout on sockets it accepted itself,
 * and the HTTP/2 server has no such timer, so the front server guards every
 * socket it hands over:
 *  - headers: from accept until a whole HTTP/1.1 request head, or an HTTP/2
 *    session's first stream (a preface alone is no request);
 *  - body: a request body whose bytes stop arriving, for longer than the
 *    timeout between two reads; on HTTP/2 only that stream is reset;
 *  - idle: no request or stream in progress;
 *  - linger: an HTTP/1.1 body still arriving after its answer (the rest
 *    is read and discarded so the client can read the answer) is cut off
 *    this long after the answer, with a lingering close.
 * Once a request's body is in, nothing runs against it: a call may take as
 * long as its own deadline allows.
 */
export function guardConnection(socket: net.Socket, timeouts: ConnectionTimeouts, onTimeout: (timeout: ConnectionTimeout) => void): ConnectionGuard {
  let h2: http2.ServerHttp2Session | undefined;
  let isHttp1 = false;
  let draining = false;
  /** HTTP/1.1 requests whose answer has not finished, or HTTP/2 streams still open. */
  let inProgress = 0;
  /** The HTTP/1.1 request whose body is still arriving, and the socket's byte count when last checked. */
  let bodyOf: http.IncomingMessage | undefined;
  let bytesAtCheck = 0;
  let idleTimer: NodeJS.Timeout | undefined;
  let bodyTimer: NodeJS.Timeout | undefined;
  let lingerTimer: NodeJS.Timeout | undefined;

  const expire = (timeout: ConnectionTimeout, close: () => void) => {
    onTimeout(timeout);
    close();
  };
  const headersExpired = () => {
    if (h2) return expire("headers", () => h2!.destroy());
    if (inProgress > 0) return;
    // A socket still being sniffed has not said which protocol an answer would be in.
    expire("headers", () => (isHttp1 ? socket.end(REQUEST_TIMEOUT_ANSWER, () => socket.destroy()) : socket.destroy()));
  };
  let headersTimer: NodeJS.Timeout | undefined = setTimeout(headersExpired, timeouts.headersTimeoutMs).unref();
  const stopHeadersTimer = () => {
    clearTimeout(headersTimer);
    headersTimer = undefined;
  };

  const idleExpired = () => {
    if (inProgress > 0 || bodyOf) return;
    if (h2) return expire("idle", () => closeGracefully(h2!, timeouts.headersTimeoutMs));
    if (socket.bytesRead !== bytesAtCheck) {
      // The next request head has started to arrive: it gets the head's own deadline.
      headersTimer = setTimeout(headersExpired, timeouts.headersTimeoutMs).unref();
      return;
    }
    // A client may have sent its next request as the timer fired, still unread here: a FIN and a lingering read
    // let it see the connection end, where a destroy would reset it mid-write (EPIPE, no answer).
    expire("idle", () => (isHttp1 ? closeLingering(socket) : socket.destroy()));
  };
  const startIdle = () => {
    bytesAtCheck = socket.bytesRead;
    if (idleTimer) idleTimer.refresh();
    else idleTimer = setTimeout(idleExpired, timeouts.idleTimeoutMs).unref();
  };

  const bodyCheck = () => {
    if (!bodyOf) return;
    if (bodyOf.complete) {
      bodyOf = undefined;
      if (inProgress === 0) startIdle();
      return;
    }
    if (socket.bytesRead === bytesAtCheck) return expire("body", () => socket.destroy());
    bytesAtCheck = socket.bytesRead;
    bodyTimer!.refresh();
  };
  const watchBody = (req: http.IncomingMessage) => {
    bodyOf = req;
    bytesAtCheck = socket.bytesRead;
    if (bodyTimer) bodyTimer.refresh();
    else bodyTimer = setTimeout(bodyCheck, timeouts.bodyTimeoutMs).unref();
  };

  const answered = () => {
    inProgress -= 1;
    if (inProgress > 0) return;
    if (draining) return void socket.destroy();
    // A body the answer did not wait for is still read to its end before the next request, for a while.
    if (!bodyOf) return startIdle();
    const lingering = bodyOf;
    clearTimeout(lingerTimer);
    lingerTimer = setTimeout(() => {
      if (bodyOf === lingering && !lingering.complete) expire("linger", () => closeLingering(socket));
    }, timeouts.lingerTimeMs).unref();
  };

  const streamClosed = () => {
    inProgress -= 1;
    if (inProgress === 0) startIdle();
  };
  const onStream = (stream: http2.ServerHttp2Stream) => {
    if (headersTimer) stopHeadersTimer();
    inProgress += 1;
    stream.once("close", streamClosed);
    if (stream.endAfterHeaders) return;
    // Http2Stream's own timer restarts on every frame read or written on the stream.
    stream.setTimeout(timeouts.bodyTimeoutMs, () => {
      stream.setTimeout(0);
      if (stream.state.remoteClose) return;
      onTimeout("body");
      stream.close(http2.constants.NGHTTP2_CANCEL);
    });
  };

  socket.once("close", () => {
    clearTimeout(headersTimer);
    clearTimeout(idleTimer);
    clearTimeout(bodyTimer);
    clearTimeout(lingerTimer);
    bodyOf = undefined;
  });

  return {
    http1() {
      isHttp1 = true;
    },
    request(req, res) {
      if (headersTimer) stopHeadersTimer();
      inProgress += 1;
      res.once("finish", answered);
      if (!req.complete && hasBody(req)) watchBody(req);
    },
    session(session) {
      h2 = session;
      session.on("stream", onStream);
    },
    drain() {
      draining = true;
      if (!h2 && inProgress === 0) socket.destroy();
    },
  };
}

/** The largest HTTP/2 stream id: a GOAWAY naming it refuses no stream (RFC 9113 §6.8). */
const MAX_STREAM_ID = 2 ** 31 - 1;

/**
 * Closes an HTTP/2 session without refusing a stream the client sent before it
 * learnt of the close (RFC 9113 §6.8): a GOAWAY naming every stream id tells
 * the client to open no more, and the answer to a ping sent behind it proves
 * that any stream the client opened meanwhile has arrived. Then the final
 * GOAWAY, and the session ends once its streams are done. A client that does
 * not answer the ping gets `waitMs`.
 */
function closeGracefully(session: http2.ServerHttp2Session, waitMs: number): void {
  session.goaway(http2.constants.NGHTTP2_NO_ERROR, MAX_STREAM_ID);
  const close = () => {
    clearTimeout(fallback);
    session.close();
  };
  const fallback = setTimeout(close, waitMs).unref();
  if (!session.ping(close)) close();
}

/** Whether an HTTP/1.1 request announces a body (RFC 9112 §6.3: a length or a transfer coding). */
function hasBody(req: http.IncomingMessage): boolean {
  const length = req.headers["content-length"];
  return (length !== undefined && length !== "0") || req.headers["transfer-encoding"] !== undefined;
}
