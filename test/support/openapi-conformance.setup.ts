import http, { type ClientRequest, type IncomingMessage, type OutgoingHttpHeaders, type RequestOptions } from "node:http";
import { syncBuiltinESMExports } from "node:module";
import { afterEach, expect } from "vitest";
import type { SentRequest } from "./openapi-conformance.js";
import { checkerFor, loadedChecker, type ExchangeChecker } from "./openapi-origins.js";

/**
 * vitest setup file, loaded for every test file: every exchange a test has
 * with a service through fetch or node:http is held against the OpenAPI
 * document (openapi-conformance.ts), request and answer, and a test that had
 * one the document does not describe fails in afterEach. Requests written on
 * raw sockets (half-sent heads and bodies) are not HTTP exchanges and are not
 * seen here. The checker itself is not imported here: a file that registers a
 * service's origin has loaded it (openapi-origins.ts).
 */
const originalFetch = globalThis.fetch;
globalThis.fetch = async (input: string | URL | Request, init?: RequestInit) => {
  const url = input instanceof Request ? input.url : String(input);
  const checker = checkerFor(url);
  if (!checker) return originalFetch(input, init);
  // A stream body is read once: one branch goes out, the other is kept to be checked.
  let kept: RequestInit | undefined = init;
  if (init?.body instanceof ReadableStream) {
    const [out, copy] = init.body.tee();
    init = { ...init, body: out };
    kept = { ...init, body: copy };
  }
  let sent: Promise<SentRequest> | undefined;
  try {
    const probe = new Request(input instanceof Request ? input.clone() : input, kept);
    sent = probe.arrayBuffer().then((bytes) => ({ method: probe.method, url: probe.url, headers: probe.headers, body: Buffer.from(bytes) }));
  } catch {
    // A request fetch itself refuses (a GET with a body) never reaches the service.
  }
  const response = await originalFetch(input, init);
  if (sent) {
    const answer = { status: response.status, headers: response.headers, body: await response.clone().text() };
    checker.recordExchange(await sent, answer);
  }
  return response;
};

const originalRequest = http.request;
http.request = function request(...args: Parameters<typeof http.request>): ClientRequest {
  const req = (originalRequest as (...a: unknown[]) => ClientRequest).apply(http, args);
  const origin = originOf(args[0]);
  const checker = origin === undefined ? undefined : checkerFor(origin);
  if (checker?.isDocumentedPath(req.path)) watch(req, origin!, checker);
  return req;
} as typeof http.request;
syncBuiltinESMExports();

afterEach(() => {
  expect(loadedChecker()?.takeViolations() ?? [], "gateway exchanges that the OpenAPI document does not describe").toEqual([]);
});

function originOf(target: unknown): string | undefined {
  if (typeof target === "string" || target instanceof URL) return new URL(target).origin;
  if (typeof target !== "object" || target === null) return undefined;
  const options = target as RequestOptions;
  return `${options.protocol ?? "http:"}//${options.hostname ?? options.host ?? "localhost"}:${options.port ?? 80}`;
}

/** Keeps what a node:http request writes and what its answer says, and checks both when the answer ends. */
function watch(req: ClientRequest, origin: string, checker: ExchangeChecker): void {
  const written: Buffer[] = [];
  const keep = (chunk: unknown, encoding: unknown) => {
    if (typeof chunk === "string") written.push(Buffer.from(chunk, typeof encoding === "string" ? (encoding as BufferEncoding) : "utf8"));
    else if (chunk instanceof Uint8Array) written.push(Buffer.from(chunk));
  };
  const write = req.write.bind(req);
  const end = req.end.bind(req);
  req.write = ((chunk: unknown, encoding?: unknown, callback?: unknown) => {
    keep(chunk, encoding);
    return (write as (...a: unknown[]) => boolean)(chunk, encoding, callback);
  }) as typeof req.write;
  req.end = ((chunk?: unknown, encoding?: unknown, callback?: unknown) => {
    if (typeof chunk !== "function") keep(chunk, encoding);
    return (end as (...a: unknown[]) => ClientRequest)(chunk, encoding, callback);
  }) as typeof req.end;
  req.prependListener("response", (res: IncomingMessage) => {
    // The body is copied as the parser pushes it, so the caller's way of reading it is left alone.
    const received: Buffer[] = [];
    const push = res.push.bind(res);
    res.push = (chunk: unknown, encoding?: BufferEncoding) => {
      if (chunk === null) {
        const sent: SentRequest = { method: req.method, url: `${origin}${req.path}`, headers: headersOf(req.getHeaders()), body: Buffer.concat(written) };
        checker.recordExchange(sent, { status: res.statusCode ?? 0, headers: headersOf(res.headers), body: Buffer.concat(received).toString("utf8") });
      } else {
        received.push(Buffer.from(chunk as Uint8Array));
      }
      return push(chunk, encoding);
    };
  });
}

function headersOf(record: OutgoingHttpHeaders | IncomingMessage["headers"]): Headers {
  const headers = new Headers();
  for (const [name, value] of Object.entries(record)) {
    if (value === undefined) continue;
    for (const item of Array.isArray(value) ? value : [value]) headers.append(name, String(item));
  }
  return headers;
}
