import http from "node:http";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SCRYPT_PARAMS } from "../../src/sign-in/passwords.js";
import { ListUsageRequestSchema } from "../../src/gen/typesafe/account/v1/account_service_pb.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { accountClient, inviteMember, refusal, startAccountApp, uniqueEmail, type AccountTestApp } from "./support.js";

/**
 * What a security review of the account area found, tried again as an
 * attacker would: password work without credentials, the Origin check, the
 * headers of every answer, passwords counted two ways or too weak, and
 * inputs that reached the database unchecked.
 */
let database: TestDatabase;
let service: AccountTestApp;
const PASSWORD = "a long enough password";

beforeAll(async () => {
  database = await createTestDatabase();
  service = await startAccountApp(database);
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

interface RawAnswer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** One HTTP/1.1 exchange with full control of the headers (Host included) and of the local address. */
function raw(
  url: string,
  init: { method?: string; path: string; headers?: Record<string, string>; body?: string | Uint8Array; localAddress?: string },
): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${url}${init.path}`, { method: init.method ?? "GET", headers: init.headers, localAddress: init.localAddress, agent: false }, (res) => {
      let body = "";
      res.setEncoding("latin1");
      res.on("data", (chunk: string) => (body += chunk));
      res.on("end", () => resolve({ status: res.statusCode!, headers: res.headers, body }));
    });
    req.on("error", reject);
    req.end(init.body);
  });
}

const postJson = (path: string, body: unknown, headers: Record<string, string> = {}, url = service.url) =>
  raw(url, { method: "POST", path, headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });

async function signedInMember(password = PASSWORD) {
  const account = await createTestAccount(database.db, { units: 1_000_000 });
  const email = uniqueEmail("member");
  const { token } = await inviteMember(database.db, account.accountId, email, service.clock.now());
  const { client, jar } = accountClient(service.url);
  await client.acceptInvite({ inviteToken: token, password });
  const cookie = [...jar.cookies].map(([n, v]) => `${n}=${v}`).join("; ");
  return { ...account, email, client, jar, cookie };
}

describe("password work is bounded", () => {
  let busy: AccountTestApp;
  beforeAll(async () => {
    // The production scrypt cost, so that each check lasts long enough for the others to find it running.
    busy = await startAccountApp(
      database,
      { TYPESAFE_PASSWORD_CHECKS_CONCURRENT: "2", TYPESAFE_PASSWORD_CHECKS_QUEUED: "4", TYPESAFE_PASSWORD_CHECKS_PER_CLIENT: "1" },
      { scryptParams: SCRYPT_PARAMS },
    );
  });
  afterAll(async () => {
    await busy?.stop();
  });

  it("one client gets one check at a time: the rest are PASSWORD_CHECKS_BUSY (429, Retry-After); another client still gets through", async () => {
    const signIn = (i: number, localAddress: string) =>
      raw(busy.url, {
        method: "POST",
        path: "/account/v1/sign-in",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ email: uniqueEmail(`burst${i}`), password: `guess number ${i}` }),
        localAddress,
      });
    const answers = await Promise.all([signIn(0, "127.0.0.1"), signIn(1, "127.0.0.1"), signIn(2, "127.0.0.1"), signIn(3, "127.0.0.2")]);
    const reasons = answers.map((a) => JSON.parse(a.body).data.reason as string);
    expect(reasons.slice(0, 3).sort()).toEqual(["PASSWORD_CHECKS_BUSY", "PASSWORD_CHECKS_BUSY", "SIGN_IN_FAILED"]);
    expect(reasons[3]).toBe("SIGN_IN_FAILED");
    for (const answer of answers.filter((a) => a.status === 429)) {
      expect(JSON.parse(answer.body).code).toBe(42904);
      expect(Number(answer.headers["retry-after"])).toBeGreaterThanOrEqual(1);
    }
  });

  it("an invite that cannot be accepted is refused before any password work: INVITE_INVALID even while the client's share is taken", async () => {
    const { client } = accountClient(busy.url);
    const [held, ...invites] = await Promise.all([
      refusal(client.signIn({ email: uniqueEmail("held"), password: "some password here" })),
      ...["x", "A".repeat(43), "B".repeat(43)].map((inviteToken) => refusal(client.acceptInvite({ inviteToken, password: "aaaaaaaaaaaa" }))),
    ]);
    expect(held.reason).toBe("SIGN_IN_FAILED");
    for (const refused of invites) expect(refused).toMatchObject({ code: Code.FailedPrecondition, reason: "INVITE_INVALID", field: "invite_token" });
  });
});

describe("passwords: one counting, and not too weak", () => {
  it("200 emoji can be set and then used to sign in", async () => {
    const password = "🔒🦊🌋🎻".repeat(50);
    const member = await signedInMember(password);
    const { client } = accountClient(service.url);
    expect((await client.signIn({ email: member.email, password })).member?.email).toBe(member.email);
    expect((await refusal(client.signIn({ email: member.email, password: "🔒".repeat(257) }))).rule).toBe("required, at most 256 characters");
  });

  it.each([["aaaaaaaaaaaa"], [" ".repeat(12)], ["password1234"], ["qwertyuiop[]"]])(
    "%j is refused (400, field password) and the invite still works afterwards",
    async (weak) => {
      const { accountId } = await createTestAccount(database.db);
      const { token } = await inviteMember(database.db, accountId, uniqueEmail("weak"), service.clock.now());
      const { client } = accountClient(service.url);
      const refused = await refusal(client.acceptInvite({ inviteToken: token, password: weak }));
      expect(refused).toMatchObject({ code: Code.InvalidArgument, reason: "INVALID_ARGUMENT", field: "password" });
      expect(refused.rule).toMatch(/^too easy to guess/);
      expect((await client.acceptInvite({ inviteToken: token, password: PASSWORD })).member?.accountId).toBe(accountId);
    },
  );
});

describe("the Origin check compares scheme, host and port with the public origin", () => {
  it("with an https public URL, Origin http://… of the same host is refused on CreateKey; the https origin passes", async () => {
    const secure = await startAccountApp(database, { TYPESAFE_PUBLIC_URL: "https://account.example.com" });
    try {
      const { accountId } = await createTestAccount(database.db);
      const { token } = await inviteMember(database.db, accountId, uniqueEmail("tls"), secure.clock.now());
      const { client, jar } = accountClient(secure.url, { headers: { origin: "https://account.example.com" } });
      await client.acceptInvite({ inviteToken: token, password: PASSWORD });
      for (const origin of ["http://account.example.com", "https://account.example.com:8443", new URL(secure.url).origin]) {
        const { client: other } = accountClient(secure.url, { headers: { origin }, jar });
        expect((await refusal(other.createKey({ name: "x" }))).reason, origin).toBe("CROSS_SITE_REFUSED");
      }
      expect((await client.createKey({ name: "ok" })).key?.name).toBe("ok");
    } finally {
      await secure.stop();
    }
  });

  it("a Host header that matches a foreign Origin (a DNS-rebound page) is refused", async () => {
    const member = await signedInMember();
    const answer = await raw(service.url, { path: "/account/v1/keys", headers: { host: "evil.example", origin: "http://evil.example", cookie: member.cookie } });
    expect([answer.status, JSON.parse(answer.body).data.reason]).toEqual([403, "CROSS_SITE_REFUSED"]);
    const own = await raw(service.url, { path: "/account/v1/keys", headers: { origin: new URL(service.url).origin, cookie: member.cookie } });
    expect(own.status).toBe(200);
  });
});

describe("every account answer carries the security headers", () => {
  const expectHeaders = (answer: RawAnswer, what: string) => {
    expect(answer.headers["x-content-type-options"], what).toBe("nosniff");
    expect(answer.headers["referrer-policy"], what).toBe("no-referrer");
    expect(answer.headers["content-security-policy"], what).toMatch(/frame-ancestors 'none'/);
    expect(answer.headers["cache-control"], what).toBe("no-store");
  };

  it("Connect, gRPC-Web, the JSON paths and the CSV, answers and refusals alike", async () => {
    const member = await signedInMember();
    const connect = (path: string, cookie?: string, contentType = "application/json", body: string | Uint8Array = "{}") =>
      raw(service.url, { method: "POST", path: `/typesafe.account.v1.AccountService/${path}`, headers: { "content-type": contentType, ...(cookie ? { cookie } : {}) }, body });
    const answers: [string, RawAnswer, number][] = [
      ["Connect ok", await connect("GetAccount", member.cookie), 200],
      ["Connect signed out", await connect("GetAccount"), 401],
      ["Connect bad input", await connect("ListUsage", member.cookie, "application/json", '{"pageSize":-1}'), 400],
      ["Connect cross-site", await raw(service.url, { method: "POST", path: "/typesafe.account.v1.AccountService/ListKeys", headers: { "content-type": "application/json", origin: "https://evil.example" }, body: "{}" }), 403],
      ["Connect unknown method", await connect("NoSuchMethod", member.cookie), 404],
      ["gRPC-Web", await connect("GetAccount", member.cookie, "application/grpc-web+proto", new Uint8Array([0, 0, 0, 0, 0])), 200],
      ["JSON ok", await raw(service.url, { path: "/account/v1/keys", headers: { cookie: member.cookie } }), 200],
      ["JSON signed out", await raw(service.url, { path: "/account/v1/account" }), 401],
      ["JSON bad JSON", await raw(service.url, { method: "POST", path: "/account/v1/sign-in", headers: { "content-type": "application/json" }, body: "{" }), 400],
      ["JSON unknown path", await raw(service.url, { path: "/account/v1/nothing-here" }), 404],
      ["CSV ok", await raw(service.url, { path: "/account/v1/usage.csv", headers: { cookie: member.cookie } }), 200],
      ["CSV signed out", await raw(service.url, { path: "/account/v1/usage.csv" }), 401],
      ["CSV bad filter", await raw(service.url, { path: "/account/v1/usage.csv?endpoint=x", headers: { cookie: member.cookie } }), 400],
    ];
    for (const [what, answer, status] of answers) {
      expect(answer.status, what).toBe(status);
      expectHeaders(answer, what);
    }
  });
});

describe("no caller input is a 500", () => {
  it("NUL and other control characters in a sign-in email are a 400 naming the field", async () => {
    const { client } = accountClient(service.url);
    for (const email of ["a\u0000@b.c", "\u0000", "a@b.c\u0007", "a\ud800@b.c"]) {
      expect(await refusal(client.signIn({ email, password: "a long enough password" })), JSON.stringify(email)).toMatchObject({
        code: Code.InvalidArgument,
        field: "email",
      });
    }
  });

  it("NUL in an invited email, a key name, a webhook URL or a role is a 400 naming the field, on Connect and the JSON path alike", async () => {
    const member = await signedInMember();
    await database.db("members").where({ email: member.email }).update({ role: "owner" });
    const nul = "a\u0000b@example.com";
    expect(await refusal(member.client.inviteMember({ email: nul }))).toMatchObject({ code: Code.InvalidArgument, field: "email" });
    const invite = await postJson("/account/v1/members/invite", { email: nul }, { cookie: member.cookie });
    expect([invite.status, JSON.parse(invite.body).data.reason, JSON.parse(invite.body).data.field]).toEqual([400, "INVALID_ARGUMENT", "email"]);
    expect(await refusal(member.client.createKey({ name: "k\u0000" }))).toMatchObject({ code: Code.InvalidArgument, field: "name" });
    expect(await refusal(member.client.addWebhookEndpoint({ url: "https://example.com/\u0000" }))).toMatchObject({ code: Code.InvalidArgument, field: "url" });
    expect(await refusal(member.client.setMemberRole({ memberId: "\u0000", role: "admin" }))).toMatchObject({ code: Code.InvalidArgument, field: "member_id" });
    expect(await refusal(member.client.createKey({ name: "k", limits: { scopes: ["decide", "x\u0000"] } }))).toMatchObject({ field: "limits.scopes[1]" });
  });

  it("an activity page token whose id is all digits but too large for a bigint is a 400", async () => {
    const member = await signedInMember();
    for (const id of ["9".repeat(19), "9223372036854775808", "1".repeat(40)]) {
      const pageToken = Buffer.from(JSON.stringify(["2026-11-26T00:00:00.000Z", id])).toString("base64url");
      expect(await refusal(member.client.listActivity({ pageToken })), id).toMatchObject({ code: Code.InvalidArgument, field: "page_token" });
    }
    const largest = Buffer.from(JSON.stringify(["2100-01-01T00:00:00.000Z", "9223372036854775807"])).toString("base64url");
    expect((await member.client.listActivity({ pageToken: largest })).events.length).toBeGreaterThan(0);
  });

  it("times out of range (a page token's, a binary Timestamp's, the CSV's) are a 400", async () => {
    const member = await signedInMember();
    const farPast = Buffer.from(JSON.stringify(["-271821-04-20T00:00:00.000Z", "00000000-0000-4000-8000-000000000000"])).toString("base64url");
    expect(await refusal(member.client.listUsage({ pageToken: farPast }))).toMatchObject({ field: "page_token" });
    const body = toBinary(ListUsageRequestSchema, create(ListUsageRequestSchema, { since: { seconds: 10n ** 15n } }));
    const binary = await raw(service.url, { method: "POST", path: "/typesafe.account.v1.AccountService/ListUsage", headers: { "content-type": "application/proto", cookie: member.cookie }, body });
    expect(binary.status).toBe(400);
    // Connect JSON cannot even carry such a Timestamp; the binary encoding can.
    const { client: binaryClient } = accountClient(service.url, { protocol: "connect-binary", jar: member.jar });
    expect(await refusal(binaryClient.getUsageSummary({ since: { seconds: -(10n ** 13n) }, until: { seconds: 0n } }))).toMatchObject({ field: "since" });
    const csv = await raw(service.url, { path: "/account/v1/usage.csv?since=0000-01-01T00:00:00Z", headers: { cookie: member.cookie } });
    expect([csv.status, JSON.parse(csv.body).data.field]).toEqual([400, "since"]);
  });

  it("a small fuzz of every JSON path: odd strings, numbers and shapes are answered below 500", async () => {
    const member = await signedInMember();
    const odd: unknown[] = ["\u0000", "\ud800", "9".repeat(40), "-1", "", " ", "%00", "../../etc", "😀".repeat(300), 1e308, -1, 2 ** 53, true, null, [], {}, "0x10", "NaN"];
    const paths: [string, string[]][] = [
      ["/account/v1/sign-in", ["email", "password"]],
      ["/account/v1/invites/accept", ["invite_token", "password"]],
      ["/account/v1/keys", ["name"]],
      ["/account/v1/keys/revoke", ["key_id"]],
      ["/account/v1/usage", ["endpoint", "page_token", "page_size", "since", "until"]],
      ["/account/v1/usage/summary", ["granularity", "since", "until"]],
      ["/account/v1/activity", ["page_token", "page_size"]],
    ];
    const failures: string[] = [];
    for (const [path, fields] of paths) {
      for (const field of fields) {
        for (const value of odd) {
          const answer = await postJson(path, { [field]: value }, { cookie: member.cookie });
          if (answer.status >= 500) failures.push(`${path} ${field}=${JSON.stringify(value)} -> ${answer.status}`);
        }
      }
    }
    for (const query of ["since=%00", "until=99999-01-01", "endpoint=%00", "since=2026-13-45", "key_id=%00", "key_id=" + "9".repeat(40)]) {
      const answer = await raw(service.url, { path: `/account/v1/usage.csv?${query}`, headers: { cookie: member.cookie } });
      if (answer.status >= 500) failures.push(`usage.csv?${query} -> ${answer.status}`);
    }
    expect(failures).toEqual([]);
  });
});
