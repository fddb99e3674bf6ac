import fs from "node:fs";
import http2 from "node:http2";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OPENAPI_DOCUMENT_PATH } from "../../src/openapi/served.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { checkAnswersOf, checkedRequestCount, requestViolationsOf } from "../support/openapi-conformance.js";
import { inviteMember, startAccountApp, uniqueEmail, type AccountTestApp } from "./support.js";

/**
 * AccountService's `google.api.http` paths (/account/v1/...) through the JSON
 * gateway: the envelope of /api/v1, behind the account area's own door (the
 * session cookie and the Origin check, never an API key), and its own
 * section of the OpenAPI document. Every exchange here is also held against
 * the document by the conformance check.
 */
let database: TestDatabase;
let service: AccountTestApp;
const PASSWORD = "a long enough password";

beforeAll(async () => {
  database = await createTestDatabase();
  service = await startAccountApp(database);
  checkAnswersOf(service.url);
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

interface Answer {
  status: number;
  headers: Headers;
  body: { code: number; message: string; data: Record<string, unknown> };
}

/** One JSON call of the account area; a POST always sends a JSON body. */
async function call(method: "GET" | "POST", path: string, init: { body?: unknown; cookie?: string; headers?: Record<string, string> } = {}): Promise<Answer> {
  const response = await fetch(`${service.url}${path}`, {
    method,
    headers: {
      ...(method === "POST" ? { "content-type": "application/json" } : {}),
      ...(init.cookie ? { cookie: init.cookie } : {}),
      ...init.headers,
    },
    body: method === "POST" ? JSON.stringify(init.body ?? {}) : undefined,
  });
  return { status: response.status, headers: response.headers, body: await response.json() };
}

/** The `name=value` of a Set-Cookie line, as a browser sends it back. */
function cookieOf(answer: Answer): string {
  const [line] = answer.headers.getSetCookie();
  expect(line, "a Set-Cookie header").toBeDefined();
  return line!.split(";")[0]!;
}

/** A fresh account with one member who accepted their invite over JSON; the cookie it got. */
async function signedInMember() {
  const account = await createTestAccount(database.db, { units: 2_500_000 });
  const email = uniqueEmail("json");
  const { token, memberId } = await inviteMember(database.db, account.accountId, email, service.clock.now());
  const accepted = await call("POST", "/account/v1/invites/accept", { body: { invite_token: token, password: PASSWORD } });
  expect(accepted.status).toBe(200);
  return { ...account, email, memberId, cookie: cookieOf(accepted) };
}

function expectNoStoreNoCors(answer: Answer): void {
  expect(answer.headers.get("cache-control")).toBe("no-store");
  expect([...answer.headers.keys()].filter((name) => name.startsWith("access-control-"))).toEqual([]);
}

describe("the account area over JSON", () => {
  it("AcceptInvite and SignIn answer in the envelope and set the session cookie, as on Connect", async () => {
    const { email, memberId, accountId } = await signedInMember();
    const signedIn = await call("POST", "/account/v1/sign-in", { body: { email, password: PASSWORD } });
    expect(signedIn.status).toBe(200);
    expect(signedIn.body).toMatchObject({ code: 0, message: "ok", data: { member: { id: memberId, email, account_id: accountId, role: "member", invite_accepted: true } } });
    const [setCookie] = signedIn.headers.getSetCookie();
    expect(setCookie).toMatch(/^typesafe_session=[^;]+; Path=\/; HttpOnly; SameSite=Strict; Max-Age=\d+$/);
    expect(signedIn.headers.get("x-request-id")).toMatch(/./);
    expectNoStoreNoCors(signedIn);

    const wrong = await call("POST", "/account/v1/sign-in", { body: { email, password: "not the password at all" } });
    expect([wrong.status, wrong.body.code, wrong.body.data["reason"]]).toEqual([401, 40103, "SIGN_IN_FAILED"]);
    expect(wrong.headers.getSetCookie()).toEqual([]);
    expectNoStoreNoCors(wrong);
  });

  it("GetAccount over GET with the cookie; without it SIGNED_OUT", async () => {
    const { cookie, accountId, email } = await signedInMember();
    const account = await call("GET", "/account/v1/account", { cookie });
    expect(account.status).toBe(200);
    expect(account.body.code).toBe(0);
    expect(account.body.data["member"]).toMatchObject({ email, account_id: accountId });
    expect(account.body.data["account"]).toMatchObject({ id: accountId, balance_credits: 2.5, available_credits: 2.5, limits: { max_in_flight: 5, requests_per_minute: 60 } });
    expectNoStoreNoCors(account);

    const signedOut = await call("GET", "/account/v1/account");
    expect([signedOut.status, signedOut.body.code, signedOut.body.data["reason"]]).toEqual([401, 40102, "SIGNED_OUT"]);
    expectNoStoreNoCors(signedOut);
  });

  it("CreateKey and RevokeKey over POST; ListKeys over GET shows both states; the revoked key is refused by /api/v1", async () => {
    const { cookie } = await signedInMember();
    const created = await call("POST", "/account/v1/keys", { cookie, body: { name: "ci runner" } });
    expect(created.status).toBe(200);
    const secret = created.body.data["secret"] as string;
    const key = created.body.data["key"] as Record<string, unknown>;
    expect(secret).toMatch(/^ts_live_/);
    expect(key).toMatchObject({ name: "ci runner", prefix: "ts_live_", last4: secret.slice(-4) });
    expect(key["revoked_at"]).toBeUndefined();

    const listed = await call("GET", "/account/v1/keys", { cookie });
    expect((listed.body.data["keys"] as { id: string }[]).map((k) => k.id)).toContain(key["id"]);
    expect(JSON.stringify(listed.body)).not.toContain(secret);

    const revoked = await call("POST", "/account/v1/keys/revoke", { cookie, body: { key_id: key["id"] } });
    expect(revoked.status).toBe(200);
    expect((revoked.body.data["key"] as Record<string, unknown>)["revoked_at"]).toEqual(expect.any(String));
    const api = await fetch(`${service.url}/api/v1/sources`, { headers: { authorization: `Bearer ${secret}` } });
    expect(api.status).toBe(401);
  });

  it("a name longer than 64 characters is a 400 naming the field, the document's rule too", async () => {
    const { cookie } = await signedInMember();
    const refused = await call("POST", "/account/v1/keys", { cookie, body: { name: "n".repeat(65) } });
    expect([refused.status, refused.body.data["reason"], refused.body.data["field"]]).toEqual([400, "INVALID_ARGUMENT", "name"]);
    const short = await call("POST", "/account/v1/invites/accept", { body: { invite_token: "x", password: "short" } });
    expect([short.status, short.body.data["field"]]).toEqual([400, "password"]);
  });

  it("SignOut clears the cookie, and the old cookie is SIGNED_OUT at once", async () => {
    const { cookie } = await signedInMember();
    const out = await call("POST", "/account/v1/sign-out", { cookie });
    expect(out.status).toBe(200);
    expect(out.headers.getSetCookie()).toEqual(["typesafe_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"]);
    const after = await call("GET", "/account/v1/keys", { cookie });
    expect([after.status, after.body.data["reason"]]).toEqual([401, "SIGNED_OUT"]);
  });
});

describe("the account area's door, the same on JSON as on Connect", () => {
  it("an API key as Bearer is SIGNED_OUT (401) on every path that needs a session, with Connect's very message", async () => {
    const { apiKey } = await signedInMember();
    const bearer = { authorization: `Bearer ${apiKey}` };
    const answers = [
      await call("GET", "/account/v1/account", { headers: bearer }),
      await call("GET", "/account/v1/keys", { headers: bearer }),
      await call("POST", "/account/v1/keys", { headers: bearer }),
      await call("POST", "/account/v1/keys/revoke", { headers: bearer, body: { key_id: "x" } }),
      await call("POST", "/account/v1/usage", { headers: bearer }),
      await call("POST", "/account/v1/usage/summary", { headers: bearer }),
      await call("POST", "/account/v1/activity", { headers: bearer }),
    ];
    const connect = await fetch(`${service.url}/typesafe.account.v1.AccountService/GetAccount`, {
      method: "POST",
      headers: { "content-type": "application/json", ...bearer },
      body: "{}",
    });
    expect(connect.status).toBe(401);
    const connectMessage = ((await connect.json()) as { message: string }).message;
    for (const answer of answers) {
      expect([answer.status, answer.body.code, answer.body.data["reason"], answer.body.message]).toEqual([401, 40102, "SIGNED_OUT", connectMessage]);
      expectNoStoreNoCors(answer);
    }
  });

  it("a page of another site is CROSS_SITE_REFUSED (403), even with a live cookie and on sign-in; the service's own origin passes", async () => {
    const { cookie, email } = await signedInMember();
    const foreign = { origin: "https://evil.example" };
    for (const answer of [
      await call("POST", "/account/v1/keys", { cookie, headers: foreign }),
      await call("GET", "/account/v1/account", { cookie, headers: foreign }),
      await call("POST", "/account/v1/sign-in", { headers: foreign, body: { email, password: PASSWORD } }),
      await call("GET", "/account/v1/keys", { cookie, headers: { "sec-fetch-site": "cross-site" } }),
    ]) {
      expect([answer.status, answer.body.code, answer.body.data["reason"], answer.body.data["field"]]).toEqual([403, 40301, "CROSS_SITE_REFUSED", "origin"]);
      expect(answer.headers.getSetCookie()).toEqual([]);
      expectNoStoreNoCors(answer);
    }
    const own = await call("GET", "/account/v1/keys", { cookie, headers: { origin: service.url, "sec-fetch-site": "same-origin" } });
    expect(own.status).toBe(200);
  });

  it("over HTTP/2 (h2c) the host is :authority: the service's own origin passes there too, another site's does not", async () => {
    const { cookie } = await signedInMember();
    const session = http2.connect(service.url);
    try {
      const get = (origin: string) =>
        new Promise<{ status: number; body: string }>((resolve, reject) => {
          const stream = session.request({ ":method": "GET", ":path": "/account/v1/keys", cookie, origin });
          let body = "";
          let status = 0;
          stream.setEncoding("utf8");
          stream.on("response", (headers) => (status = Number(headers[":status"])));
          stream.on("data", (chunk: string) => (body += chunk));
          stream.on("end", () => resolve({ status, body }));
          stream.on("error", reject);
        });
      expect((await get(service.url)).status).toBe(200);
      const foreign = await get("https://evil.example");
      expect([foreign.status, JSON.parse(foreign.body).data.reason]).toEqual([403, "CROSS_SITE_REFUSED"]);
    } finally {
      session.close();
    }
  });

  it("another account's key id is NOT_FOUND with the very answer of a missing one, and that key lives on", async () => {
    const a = await signedInMember();
    const b = await signedInMember();
    const others = await call("POST", "/account/v1/keys/revoke", { cookie: a.cookie, body: { key_id: b.keyId } });
    const missing = await call("POST", "/account/v1/keys/revoke", { cookie: a.cookie, body: { key_id: "00000000-0000-4000-8000-000000000000" } });
    expect([others.status, others.body.code, others.body.data["reason"]]).toEqual([404, 40401, "NOT_FOUND"]);
    expect({ ...others.body, data: { ...others.body.data, request_id: undefined } }).toEqual({ ...missing.body, data: { ...missing.body.data, request_id: undefined } });
    const bKeys = await call("GET", "/account/v1/keys", { cookie: b.cookie });
    expect((bKeys.body.data["keys"] as { id: string; revoked_at?: string }[]).find((k) => k.id === b.keyId)?.revoked_at).toBeUndefined();
    const api = await fetch(`${service.url}/api/v1/sources`, { headers: { authorization: `Bearer ${b.apiKey}` } });
    expect(api.status).toBe(200);
  });

  it("an account call is a JSON request like any other: a wrong content type is 415, a bad page size 400", async () => {
    const { cookie } = await signedInMember();
    const response = await fetch(`${service.url}/account/v1/keys`, { method: "POST", headers: { cookie, "content-type": "text/plain" }, body: "{}" });
    expect(response.status).toBe(415);
    const big = await call("POST", "/account/v1/usage", { cookie, body: { page_size: 501 } });
    expect([big.status, big.body.data["field"]]).toEqual([400, "page_size"]);
    const endpoint = await call("POST", "/account/v1/usage", { cookie, body: { endpoint: "everything" } });
    expect([endpoint.status, endpoint.body.data["field"]]).toEqual([400, "endpoint"]);
    const usage = await call("POST", "/account/v1/usage", { cookie, body: { endpoint: "search", page_size: 10 } });
    expect(usage.body).toEqual({ code: 0, message: "ok", data: { records: [], next_page_token: "" } });
  });
});

describe("the OpenAPI document's account section", () => {
  const document = JSON.parse(fs.readFileSync(OPENAPI_DOCUMENT_PATH, "utf8"));
  const accountOperations = Object.entries(document.paths as Record<string, Record<string, Record<string, unknown>>>)
    .filter(([path]) => path.startsWith("/account/v1/"))
    .flatMap(([path, methods]) => Object.entries(methods).map(([method, operation]) => ({ path, method, operation })));

  it("has every AccountService path under its own tag, with the session cookie as its security scheme", () => {
    expect(accountOperations.map(({ method, path }) => `${method.toUpperCase()} ${path}`).sort()).toEqual(
      [
        "POST /account/v1/invites/accept",
        "POST /account/v1/sign-in",
        "POST /account/v1/sign-out",
        "GET /account/v1/account",
        "GET /account/v1/keys",
        "POST /account/v1/keys",
        "POST /account/v1/keys/revoke",
        "POST /account/v1/keys/update",
        "POST /account/v1/keys/roll",
        "POST /account/v1/usage",
        "POST /account/v1/usage/summary",
        "POST /account/v1/activity",
        "POST /account/v1/sign-in/second-step",
        "GET /account/v1/members",
        "POST /account/v1/members/invite",
        "POST /account/v1/members/remove",
        "POST /account/v1/members/role",
        "POST /account/v1/two-factor/start",
        "POST /account/v1/two-factor/confirm",
        "POST /account/v1/two-factor/disable",
        "POST /account/v1/two-factor/required",
        "GET /account/v1/alerts",
        "POST /account/v1/alerts",
        "GET /account/v1/webhooks",
        "POST /account/v1/webhooks",
        "POST /account/v1/webhooks/remove",
        "POST /account/v1/webhooks/rotate",
        "POST /account/v1/webhooks/enable",
        "POST /account/v1/webhooks/test",
        "POST /account/v1/webhooks/deliveries",
        "POST /account/v1/webhooks/deliveries/replay",
        "POST /account/v1/evaluations",
        "GET /account/v1/evaluations",
        "POST /account/v1/evaluations/get",
        "POST /account/v1/evaluations/cancel",
        "POST /account/v1/evaluations/resume",
        "POST /account/v1/evaluations/delete",
        "POST /account/v1/evaluations/results",
        "POST /account/v1/calibrations",
        "GET /account/v1/calibrations",
        "POST /account/v1/calibrations/get",
      ].sort(),
    );
    expect(document.components.securitySchemes.sessionCookie).toMatchObject({ type: "apiKey", in: "cookie", name: "typesafe_session" });
    for (const { path, operation } of accountOperations) {
      expect(operation["tags"], path).toEqual(["AccountService"]);
      const sessionless = ["/account/v1/invites/accept", "/account/v1/sign-in", "/account/v1/sign-in/second-step", "/account/v1/sign-out"].includes(path);
      expect(operation["security"], path).toEqual(sessionless ? [] : [{ sessionCookie: [] }]);
    }
    // The API keeps its key.
    expect(document.paths["/api/v1/decisions"].post.security).toEqual([{ apiKey: [] }]);
  });

  it("lists the account area's errors and the common ones, none of the metering's nor the API key's", () => {
    const revoke = document.paths["/account/v1/keys/revoke"].post;
    expect(Object.keys(revoke.responses)).toEqual(["200", "400", "401", "403", "404", "405", "409", "410", "413", "415", "429", "499", "500", "503"]);
    expect(revoke.responses["401"]).toEqual({ $ref: "#/components/responses/AccountError401" });
    const descriptions = (status: number) => document.components.responses[`AccountError${status}`].description as string;
    expect(descriptions(401)).toMatch(/^SIGNED_OUT: .* SIGN_IN_FAILED: /);
    expect(descriptions(401)).not.toContain("UNAUTHENTICATED");
    expect(descriptions(429)).toMatch(/^SIGN_IN_THROTTLED: [^]*$/);
    expect(descriptions(429)).not.toMatch(/RATE_LIMITED|CONCURRENCY_LIMITED/);
    expect(descriptions(403)).toContain("CROSS_SITE_REFUSED");
    expect(descriptions(503)).toContain("UNAVAILABLE");
    expect(descriptions(503)).not.toContain("NOT_CONFIGURED");
    expect(document.components.responses.AccountError402).toBeUndefined();
    expect(revoke.responses["200"].headers["cache-control"]).toEqual(expect.objectContaining({ required: true, schema: { const: "no-store" } }));
  });

  it("states the request rules validation has", () => {
    const { schemas } = document.components;
    expect(schemas["typesafe.account.v1.AcceptInviteRequest"].properties.password).toMatchObject({ minLength: 12 });
    expect(schemas["typesafe.account.v1.AcceptInviteRequest"].required).toEqual(["invite_token", "password"]);
    expect(schemas["typesafe.account.v1.SignInRequest"].required).toEqual(["email", "password"]);
    expect(schemas["typesafe.account.v1.CreateKeyRequest"].properties.name).toMatchObject({ maxLength: 64 });
    expect(schemas["typesafe.account.v1.ListUsageRequest"].properties.endpoint.enum).toEqual(["", "decide", "search", null]);
    expect(schemas["typesafe.account.v1.ListUsageRequest"].properties.page_size.anyOf[0]).toMatchObject({ minimum: 0, maximum: 500 });
    expect(schemas["typesafe.account.v1.ListActivityRequest"].properties.page_size.anyOf[0]).toMatchObject({ minimum: 0, maximum: 500 });
    expect(schemas["typesafe.account.v1.GetUsageSummaryRequest"].properties.granularity.enum).toEqual(["", "day", "hour", null]);
  });

  it("the conformance check wants the session cookie where the document does, and not where it does not", () => {
    const sent = (path: string, headers: Record<string, string>) => ({ method: "GET", url: `http://127.0.0.1:1${path}`, headers: new Headers(headers), body: Buffer.alloc(0) });
    const ok = { status: 200, headers: new Headers(), body: "{}" };
    expect(requestViolationsOf(sent("/account/v1/keys", { authorization: "Bearer ts_live_x" }), ok)).toEqual([expect.stringContaining("the service served a request the document refuses (no sessionCookie)")]);
    expect(requestViolationsOf(sent("/account/v1/keys", { cookie: "other=1; typesafe_session=abc" }), ok)).toEqual([]);
    expect(requestViolationsOf(sent("/account/v1/keys", { cookie: "__Host-typesafe_session=abc" }), ok)).toEqual([]);
    const post = (body: unknown) => ({ method: "POST", url: "http://127.0.0.1:1/account/v1/sign-in", headers: new Headers({ "content-type": "application/json" }), body: Buffer.from(JSON.stringify(body)) });
    expect(requestViolationsOf(post({ email: "a@example.com", password: "x" }), ok)).toEqual([]);
    expect(requestViolationsOf(post({ email: "a@example.com" }), ok)).toEqual([expect.stringContaining("required property 'password'")]);
  });

  it("the conformance check judged this file's account requests", async () => {
    const before = checkedRequestCount();
    const refused = await call("GET", "/account/v1/keys", { cookie: "typesafe_session=not-a-session" });
    expect(refused.status).toBe(401);
    expect(checkedRequestCount()).toBe(before + 1);
  });
});
