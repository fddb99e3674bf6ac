/**
 * Whether a request may come from where the browser says it comes from. A
 * page of another site can make a browser send requests here (cross-site
 * request forgery); browsers name the page's origin in `Origin` and, more
 * recently, its relation to us in `Sec-Fetch-Site`. A request is refused when
 * either says another site. `Origin` must be one of the allowed origins
 * exactly, scheme, host and port: the public URL's origin (and, when none is
 * configured, the listening address's). The `Host` header is never trusted
 * for this: a caller writes it, and a DNS-rebound page sends its own name
 * there. `Origin: null` (a sandboxed or privacy-hidden page) and an origin not
 * in the canonical form browsers send are refused. A request with neither
 * header (curl, a server) is not a browser's, and passes.
 */
export function isCrossSite(headers: Headers, allowedOrigins: ReadonlySet<string>): boolean {
  const fetchSite = headers.get("sec-fetch-site");
  if (fetchSite !== null && fetchSite !== "same-origin" && fetchSite !== "none") return true;
  const origin = headers.get("origin");
  return origin !== null && !allowedOrigins.has(origin);
}

/** Loopback names a browser may use for a service listening on loopback. */
const LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]"];

/**
 * The origins of a service reached at its listening address, used when no
 * public URL is configured: `http://HOST:PORT` with the port really bound,
 * and on loopback each loopback name (a browser shows what was typed).
 */
export function listeningOrigins(host: string, port: number): string[] {
  const bracketed = host.includes(":") ? `[${host}]` : host;
  const hosts = LOOPBACK_HOSTS.includes(bracketed) ? LOOPBACK_HOSTS : [bracketed];
  return hosts.map((name) => new URL(`http://${name}:${port}`).origin);
}
