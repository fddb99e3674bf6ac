import type http from "node:http";
import type http2 from "node:http2";

/** A Node request's headers as fetch Headers, without HTTP/2 pseudo-headers: what handler contexts carry. */
export function requestHeaders(req: http.IncomingMessage | http2.Http2ServerRequest): Headers {
  const headers = new Headers();
  for (const [name, value] of Object.entries(req.headers)) {
    if (name.startsWith(":") || value === undefined) continue;
    headers.set(name, Array.isArray(value) ? value.join(", ") : value);
  }
  return headers;
}

/** Fetch Headers as the record Node's writeHead and addTrailers take. */
export function headerRecord(headers: Headers): Record<string, string> {
  const record: Record<string, string> = {};
  headers.forEach((value, name) => {
    record[name] = value;
  });
  return record;
}
