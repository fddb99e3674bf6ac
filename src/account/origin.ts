/**
 * Whether a request may come from where the browser says it comes from. A
 * page of another site can make a browser send requests here (cross-site
 * request forgery); browsers name the page's origin in `Origin` and, more
 * recently, its relation to us in `Sec-Fetch-Site`. A request is refused when
 * either says another site: `Origin` must be the public URL's origin or name
 * the host the request was sent to (same-origin when reached directly);
 * `Origin: null` (a sandboxed or privacy-hidden page) and an origin not in
 * the canonical form browsers send are refused too. The request's host is the
 * Host header, or HTTP/2's :authority (which Fetch headers cannot hold). A
 * request with neither header (curl, a server) is not a browser's, and passes.
 */
export function isCrossSite(headers: Headers, publicOrigin: string, requestHost: string | undefined): boolean {
  const fetchSite = headers.get("sec-fetch-site");
  if (fetchSite !== null && fetchSite !== "same-origin" && fetchSite !== "none") return true;
  const origin = headers.get("origin");
  if (origin === null) return false;
  if (origin === publicOrigin) return false;
  let originHost: string;
  try {
    const url = new URL(origin);
    if (url.origin !== origin) return true;
    originHost = url.host;
  } catch {
    return true;
  }
  return requestHost === undefined || requestHost.toLowerCase() !== originHost;
}
