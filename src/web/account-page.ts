import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { apiError, toPublicError } from "../errors.js";
import { sendError, type NodeRequest, type NodeResponse } from "../http/envelope.js";

/**
 * The built account page (src/web/bundle-account-page.mjs writes it at build
 * time). src/ and dist/bundle/ both sit two levels below the root, so the same
 * relative path finds it from either.
 */
export const ACCOUNT_PAGE_DIR = fileURLToPath(new URL("../../dist/public/account", import.meta.url));

/**
 * Sent with everything under /account/: scripts and styles only from this
 * origin (none inline), never framed, no <base> and forms posting only here;
 * no MIME sniffing; no Referer, so an invite token in the address never leaks.
 * No CORS header is ever sent: the page and its RPCs are same-origin only.
 */
export const ACCOUNT_PAGE_HEADERS: Readonly<Record<string, string>> = {
  "content-security-policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
};

/** index.html is revalidated on every load; the hashed script and style never change under their names. */
const HTML_CACHE = "no-cache";
const ASSET_CACHE = "public, max-age=31536000, immutable";
const CONTENT_TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
};

interface PageFile {
  body: Buffer;
  contentType: string;
  cacheControl: string;
  etag: string;
}

type Handler = (req: NodeRequest, res: NodeResponse) => void;

/**
 * Serves the account page at /account/ (and redirects /account there) in
 * front of `next`, the gateway. Only the files of the built page are served,
 * by exact name, from memory; every other path, /account/v1/... included,
 * goes on to `next`.
 */
export function withAccountPage(next: Handler, dir: string = ACCOUNT_PAGE_DIR): Handler {
  let files: Map<string, PageFile> | undefined;
  return (req, res) => {
    const url = req.url ?? "/";
    const queryAt = url.indexOf("?");
    const pathname = queryAt < 0 ? url : url.slice(0, queryAt);
    if (pathname === "/account") {
      if (!isRead(req)) return refuse(req, res, pathname);
      // The query goes along: an invite link may be typed without the slash.
      res.writeHead(308, { ...ACCOUNT_PAGE_HEADERS, location: `/account/${queryAt < 0 ? "" : url.slice(queryAt)}`, "content-length": "0" });
      return void res.end();
    }
    if (!pathname.startsWith("/account/")) return next(req, res);
    const name = pathname === "/account/" ? "index.html" : pathname.slice("/account/".length);
    if (name.includes("/") || (name === "index.html" && pathname !== "/account/")) return next(req, res);
    files ??= readPage(dir);
    const file = files?.get(name);
    if (!file) {
      if (files || pathname !== "/account/") return next(req, res);
      res.writeHead(503, { ...ACCOUNT_PAGE_HEADERS, "content-type": "text/plain; charset=utf-8", "cache-control": "no-store" });
      return void res.end("The account page is not built: run `npm run build`.\n");
    }
    if (!isRead(req)) return refuse(req, res, pathname);
    const headers = { ...ACCOUNT_PAGE_HEADERS, "content-type": file.contentType, "cache-control": file.cacheControl, etag: file.etag };
    if (req.headers["if-none-match"] === file.etag) {
      res.writeHead(304, headers);
      return void res.end();
    }
    res.writeHead(200, { ...headers, "content-length": String(file.body.length) });
    if (req.method === "HEAD") res.end();
  else res.end(file.body);
  };
}

function isRead(req: NodeRequest): boolean {
  return req.method === "GET" || req.method === "HEAD";
}

/** A 405 in the gateway's envelope, from the one error table. */
function refuse(req: NodeRequest, res: NodeResponse, pathname: string): void {
  const requestId = crypto.randomUUID();
  req.resume();
  const error = apiError("METHOD_NOT_ALLOWED", `${pathname} accepts GET, HEAD`, { metadata: { allow: "GET, HEAD" } });
  sendError(res, toPublicError(error, requestId), { ...ACCOUNT_PAGE_HEADERS, allow: "GET, HEAD", "x-request-id": requestId });
}

/**
 * The built page's files by name, or undefined while it is not built or a
 * build is replacing it (then it is read again on the next request).
 */
function readPage(dir: string): Map<string, PageFile> | undefined {
  const files = new Map<string, PageFile>();
  try {
    for (const name of fs.readdirSync(dir)) {
      const contentType = CONTENT_TYPES[path.extname(name)];
      if (!contentType) continue;
      const body = fs.readFileSync(path.join(dir, name));
      const etag = `"${crypto.createHash("sha256").update(body).digest("base64url").slice(0, 22)}"`;
      files.set(name, { body, contentType, cacheControl: name === "index.html" ? HTML_CACHE : ASSET_CACHE, etag });
    }
  } catch {
    return undefined;
  }
  return files.has("index.html") ? files : undefined;
}
