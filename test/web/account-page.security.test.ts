import fs from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { withAccountPage } from "../../src/web/account-page.js";
import { bundleAccountPage } from "../../src/web/bundle-account-page.mjs";
import { startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";

const CSP = "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

let database: TestDatabase;
let service: TestApp;
let assets: string[];

beforeAll(async () => {
  bundleAccountPage();
  database = await createTestDatabase();
  service = await startTestApp(database);
  const html = await (await fetch(`${service.url}/account/`)).text();
  assets = [...html.matchAll(/(?:src|href)="\.\/([^"]+)"/g)].map((m) => m[1]!);
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

/** Raw HTTP/1.1 GET, so the path reaches the server exactly as written (fetch would normalise it). */
function rawGet(path: string): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get(`${service.url}${path}`, (res) => {
      let body = "";
      res.on("data", (chunk: Buffer) => (body += chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on("error", reject);
  });
}

function expectPageHeaders(headers: Headers): void {
  expect(headers.get("content-security-policy")).toBe(CSP);
  expect(headers.get("x-content-type-options")).toBe("nosniff");
  expect(headers.get("referrer-policy")).toBe("no-referrer");
  expect([...headers.keys()].filter((name) => name.startsWith("access-control-"))).toEqual([]);
}

describe("the account page's answers", () => {
  it("serves /account/ as HTML with exactly the page's security headers, revalidated on each load", async () => {
    // A cross-site Origin must not earn any CORS header.
    const response = await fetch(`${service.url}/account/?invite=abc`, { headers: { origin: "https://elsewhere.example" } });
    expect(response.status).toBe(200);
    expectPageHeaders(response.headers);
    expect(response.headers.get("content-type")).toBe("text/html; charset=utf-8");
    expect(response.headers.get("cache-control")).toBe("no-cache");
    expect([...response.headers.keys()].sort()).toEqual(
      ["cache-control", "connection", "content-length", "content-security-policy", "content-type", "date", "etag", "keep-alive", "referrer-policy", "x-content-type-options"],
    );
    const html = await response.text();
    expect(html).toContain("<title>");
    expect(html).toContain('<html lang="en">');
  });

  it("links one hashed script and one hashed style sheet, and nothing inline that the policy would block", async () => {
    const html = await (await fetch(`${service.url}/account/`)).text();
    expect(assets).toEqual([expect.stringMatching(/^style-[A-Z0-9]+\.css$/), expect.stringMatching(/^app-[A-Z0-9]+\.js$/)]);
    expect(html).not.toMatch(/<script(?![^>]*\bsrc=)[^>]*>/);
    expect(html).not.toMatch(/<style|\sstyle=|\son[a-z]+=/i);
  });

  it("serves each asset with the same headers, its type and a year of immutable caching", async () => {
    for (const asset of assets) {
      const response = await fetch(`${service.url}/account/${asset}`);
      expect(response.status, asset).toBe(200);
      expectPageHeaders(response.headers);
      expect(response.headers.get("content-type")).toBe(asset.endsWith(".js") ? "text/javascript; charset=utf-8" : "text/css; charset=utf-8");
      expect(response.headers.get("cache-control")).toBe("public, max-age=31536000, immutable");
    }
  });

  it("ships no API key and no Authorization header in any of its files", async () => {
    for (const name of ["", ...assets]) {
      const body = await (await fetch(`${service.url}/account/${name}`)).text();
      expect(body.length, name).toBeGreaterThan(0);
      expect(body, name).not.toContain("ts_live_");
      expect(body, name).not.toMatch(/authorization/i);
    }
  });

  it("answers a matching If-None-Match with 304", async () => {
    const first = await fetch(`${service.url}/account/`);
    const etag = first.headers.get("etag")!;
    expect(etag).toMatch(/^".+"$/);
    const again = await fetch(`${service.url}/account/`, { headers: { "if-none-match": etag } });
    expect(again.status).toBe(304);
    expectPageHeaders(again.headers);
  });

  it("redirects /account to /account/, keeping the query (an invite link without its slash)", async () => {
    const response = await fetch(`${service.url}/account?invite=tok_1`, { redirect: "manual" });
    expect(response.status).toBe(308);
    expect(response.headers.get("location")).toBe("/account/?invite=tok_1");
    expectPageHeaders(response.headers);
  });

  it("refuses other methods with the gateway's 405 envelope", async () => {
    const response = await fetch(`${service.url}/account/`, { method: "POST", body: "email=a&password=b" });
    expect(response.status).toBe(405);
    expect(response.headers.get("allow")).toBe("GET, HEAD");
    expectPageHeaders(response.headers);
    expect(await response.json()).toMatchObject({ code: 40501, data: { reason: "METHOD_NOT_ALLOWED" } });
  });

  it.each(["/account/index.html", "/account/..%2Fpackage.json", "/account/../package.json", "/account/app.ts", "/account/v1/nothing-here"])(
    "serves only the built files by exact name: %s is not the page's",
    async (path) => {
      const response = await rawGet(path);
      expect(response.status).toBe(404);
      // Not the page's policy; the account API's own answers carry theirs (default-src 'none').
      expect([undefined, "default-src 'none'; frame-ancestors 'none'"]).toContain(response.headers["content-security-policy"]);
      expect(JSON.parse(response.body)).toMatchObject({ data: { reason: "NOT_FOUND" } });
    },
  );
});

describe("withAccountPage on its own", () => {
  /** A bare server with the page handler in front of a next handler that answers 404 "next". */
  async function serve(dir: string): Promise<{ url: string; close(): Promise<void> }> {
    const server = http.createServer(
      withAccountPage((_req, res) => {
        res.writeHead(404, { "content-type": "text/plain" });
        res.end("next");
      }, dir),
    );
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const { port } = server.address() as AddressInfo;
    return { url: `http://127.0.0.1:${port}`, close: () => new Promise((resolve) => server.close(() => resolve())) };
  }

  it("answers 503 with the build command while the page is not built, and serves it once it is, without a restart", async () => {
    const dir = path.join(await fs.mkdtemp(path.join(os.tmpdir(), "account-page-")), "account");
    const server = await serve(dir);
    try {
      const missing = await fetch(`${server.url}/account/`);
      expect(missing.status).toBe(503);
      expect(await missing.text()).toContain("npm run build");
      expect(missing.headers.get("content-security-policy")).toBe(CSP);
      expect((await fetch(`${server.url}/account/app.js`)).status).toBe(404);

      const files = bundleAccountPage({ outDir: dir });
      const built = await fetch(`${server.url}/account/`);
      expect(built.status).toBe(200);
      const script = files.find((name) => name.endsWith(".js"))!;
      const head = await fetch(`${server.url}/account/${script}`, { method: "HEAD" });
      expect(head.status).toBe(200);
      expect(Number(head.headers.get("content-length"))).toBe((await fs.stat(path.join(dir, script))).size);
      expect(await head.text()).toBe("");
    } finally {
      await server.close();
      await fs.rm(path.dirname(dir), { recursive: true, force: true });
    }
  });
});
