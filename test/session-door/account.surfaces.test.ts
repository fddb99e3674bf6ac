import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { DecisionService } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hashApiKey } from "../../src/keys/api-keys.js";
import { admit, admitMany, finish } from "../../src/metering/ledger.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { accountClient, inviteMember, refusal, startAccountApp, uniqueEmail, type AccountTestApp } from "./support.js";

/**
 * The account area on each surface it is served on (Connect JSON and binary,
 * gRPC-Web, gRPC), its log line and metrics, the CSV download, paging and
 * the 400s of bad input.
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

async function signedInMember(protocol?: "connect" | "connect-binary" | "grpc-web" | "grpc") {
  const account = await createTestAccount(database.db, { units: 10_000_000, name: "surf" });
  const email = uniqueEmail("surf");
  const { token } = await inviteMember(database.db, account.accountId, email, service.clock.now());
  const { client, jar } = accountClient(service.url, { protocol });
  await client.acceptInvite({ inviteToken: token, password: PASSWORD });
  return { ...account, email, client, jar };
}

/** Finished calls of the key at the given times (the ledger's own functions, as the API's calls use them). */
async function finishedCalls(apiKey: string, times: Date[], endpoint: "decide" | "search" = "decide"): Promise<string[]> {
  const ids: string[] = [];
  for (const now of times) {
    const admission = await admit(database.db, { keyHash: hashApiKey(apiKey), endpoint, reserveUnits: 1_000, freeAllowed: false, leaseMs: 60_000, now });
    if (admission.outcome !== "admitted") throw new Error(admission.outcome);
    await finish(database.db, { requestId: admission.requestId, success: true, actualUnits: 250, now: new Date(now.getTime() + 10) });
    ids.push(admission.requestId);
  }
  return ids;
}

describe("every protocol", () => {
  it.each(["connect", "connect-binary", "grpc-web", "grpc"] as const)("%s: the cookie signs in, and a call without it is refused", async (protocol) => {
    const member = await signedInMember(protocol);
    expect(member.jar.cookies.get("typesafe_session")).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect((await member.client.getAccount({})).account).toMatchObject({ id: member.accountId, balanceCredits: 10 });
    const { client } = accountClient(service.url, { protocol });
    expect(await refusal(client.listKeys({}))).toMatchObject({ code: Code.Unauthenticated, reason: "SIGNED_OUT" });
  });
});

describe("answers", () => {
  it("are never cached, and a refusal names its field and rule", async () => {
    const member = await signedInMember();
    const cookie = `typesafe_session=${member.jar.cookies.get("typesafe_session")}`;
    const ok = await fetch(`${service.url}/typesafe.account.v1.AccountService/ListKeys`, { method: "POST", headers: { "content-type": "application/json", cookie }, body: "{}" });
    expect(ok.status).toBe(200);
    expect(ok.headers.get("cache-control")).toBe("no-store");
    const crossSite = await fetch(`${service.url}/typesafe.account.v1.AccountService/ListKeys`, {
      method: "POST",
      headers: { "content-type": "application/json", cookie, origin: "https://evil.example" },
      body: "{}",
    });
    const body = await crossSite.json();
    expect(body.details[0]).toMatchObject({ type: "typesafe.error.v1.ErrorDetail" });
    const refused = await refusal(accountClient(service.url, { headers: { origin: "https://evil.example" } }).client.listKeys({}));
    expect(refused.reason).toBe("CROSS_SITE_REFUSED");
  });
});

describe("other services", () => {
  it("pass the account door untouched: a Connect call with an API key and no cookie reaches its service", async () => {
    const member = await signedInMember();
    const decisions = createClient(DecisionService, createConnectTransport({ baseUrl: service.url, httpVersion: "1.1" }));
    const refused = await refusal(
      decisions.decide(
        { model: "typesafe/service-1.13", state: { kind: { case: "stringValue", value: "s" } }, questions: { q: { type: "noul", instructions: "Yes?" } } },
        { headers: { authorization: `Bearer ${member.apiKey}` } },
      ),
    );
    // No LLM is configured here: the decision service itself answers.
    expect(refused.reason).toBe("NOT_CONFIGURED");
  });
});

describe("the call line", () => {
  it("logs one line per call like every other call, never the password, email or token", async () => {
    const member = await signedInMember();
    const before = service.logLines.length;
    await member.client.signIn({ email: member.email, password: PASSWORD });
    await refusal(member.client.signIn({ email: member.email, password: "wrong password!" }));
    const lines = service.logLines.slice(before).map((line) => JSON.parse(line));
    const calls = lines.filter((l) => l.msg === "call" && l.procedure === "/typesafe.account.v1.AccountService/SignIn");
    expect(calls.map((c) => [c.status, c.reason])).toEqual([
      ["ok", undefined],
      ["error", "SIGN_IN_FAILED"],
    ]);
    const text = service.logLines.join("\n");
    expect(text).not.toContain(PASSWORD);
    expect(text).not.toContain(member.email);
    expect(text).not.toContain(member.jar.cookies.get("typesafe_session"));
  });
});

describe("metrics", () => {
  it("count sign-ins by outcome and the sessions live now", async () => {
    const read = async () => await (await fetch(`${service.url}/metrics`)).text();
    const value = (text: string, line: string) => Number(new RegExp(`^${line.replace(/[{}]/g, "\\$&")} (\\S+)$`, "m").exec(text)?.[1]);
    const before = await read();
    const member = await signedInMember();
    await member.client.signIn({ email: member.email, password: PASSWORD });
    await refusal(member.client.signIn({ email: member.email, password: "wrong password!" }));
    const after = await read();
    expect(value(after, 'typesafe_account_sign_ins_total{outcome="ok"}') - value(before, 'typesafe_account_sign_ins_total{outcome="ok"}')).toBe(1);
    expect(value(after, 'typesafe_account_sign_ins_total{outcome="failed"}') - value(before, 'typesafe_account_sign_ins_total{outcome="failed"}')).toBe(1);
    // Other test files may sign in on the shared store meanwhile: the gauge must match the table between two scrapes that agree.
    const liveInTable = async () => {
      const now = service.clock.now();
      const rows = await database.db("member_sessions")
        .whereNull("ended_at")
        .where("expires_at", ">", now)
        .where("last_seen_at", ">", new Date(now.getTime() - 30 * 60_000))
        .count({ n: "*" });
      return Number(rows[0]!.n);
    };
    const settled = async () => {
      for (let attempt = 0; attempt < 20; attempt++) {
        const before = value(await read(), "typesafe_account_sessions_active");
        const counted = await liveInTable();
        if (value(await read(), "typesafe_account_sessions_active") === before && before === counted) return counted;
      }
      throw new Error("the sessions gauge never matched the table");
    };
    expect(await settled()).toBeGreaterThanOrEqual(1);
    await member.client.signOut({});
    await settled();
  });
});

describe("usage", () => {
  it("pages newest first with opaque tokens, filtered by endpoint and time range", async () => {
    const member = await signedInMember();
    const base = Date.UTC(2030, 0, 1);
    const at = (minutes: number) => new Date(base + minutes * 60_000);
    const decided = await finishedCalls(member.apiKey, [at(1), at(2), at(3), at(4), at(5)]);
    const searched = await finishedCalls(member.apiKey, [at(6)], "search");
    const seen: string[] = [];
    let pageToken = "";
    let pages = 0;
    do {
      const page = await member.client.listUsage({ pageSize: 2, pageToken });
      expect(page.records).toHaveLength(2);
      seen.push(...page.records.map((r) => r.requestId));
      pageToken = page.nextPageToken;
      pages++;
    } while (pageToken !== "");
    // Six calls in pages of two: the third page says it is the last.
    expect(pages).toBe(3);
    expect(seen).toEqual([...decided, ...searched].reverse());
    const filtered = await member.client.listUsage({
      endpoint: "decide",
      since: { seconds: BigInt(at(2).getTime() / 1000) },
      until: { seconds: BigInt(at(4).getTime() / 1000) },
    });
    expect(filtered.records.map((r) => r.requestId)).toEqual([decided[2], decided[1]]);
    const decideOnly = await member.client.listUsage({ endpoint: "decide", since: { seconds: BigInt(at(5).getTime() / 1000) } });
    expect(decideOnly.records.map((r) => r.requestId)).toEqual([decided[4]]);
    const searchOnly = await member.client.listUsage({ endpoint: "search" });
    expect(searchOnly.records.map((r) => r.requestId)).toEqual(searched);
    expect(timestampDate(filtered.records[0]!.finishedAt!).getTime()).toBe(at(3).getTime() + 10);
    expect(filtered.records[0]).toMatchObject({ endpoint: "decide", funding: "paid", reservedCredits: 0.001, chargedCredits: 0.00025, status: "settled", keyId: member.keyId });

    const summary = await member.client.getUsageSummary({ since: { seconds: BigInt(base / 1000) }, until: { seconds: BigInt(at(60 * 24 * 2).getTime() / 1000) } });
    expect(summary.buckets.map((b) => [Number(b.start!.seconds) * 1000, b.endpoint, b.calls, b.chargedCredits])).toEqual([
      [base, "decide", 5, 0.00125],
      [base, "search", 1, 0.00025],
    ]);
    const hourly = await member.client.getUsageSummary({ granularity: "hour", since: { seconds: BigInt(base / 1000) }, until: { seconds: BigInt(at(120).getTime() / 1000) } });
    expect(hourly.buckets.map((b) => [b.endpoint, b.calls])).toEqual([
      ["decide", 5],
      ["search", 1],
    ]);
  });

  it("the CSV download holds the same rows, RFC 4180, as an attachment, for a signed-in member only", async () => {
    const member = await signedInMember();
    const ids = await finishedCalls(member.apiKey, [new Date(Date.UTC(2030, 5, 1)), new Date(Date.UTC(2030, 5, 2))]);
    const cookie = `typesafe_session=${member.jar.cookies.get("typesafe_session")}`;
    const response = await fetch(`${service.url}/account/v1/usage.csv?endpoint=decide&since=2030-06-01T00:00:00Z`, { headers: { cookie } });
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toBe("text/csv; charset=utf-8; header=present");
    expect(response.headers.get("content-disposition")).toBe('attachment; filename="usage.csv"');
    expect(response.headers.get("cache-control")).toBe("no-store");
    const lines = (await response.text()).split("\r\n");
    expect(lines[0]).toBe("request_id,endpoint,key_id,funding,reserved_credits,charged_credits,status,started_at,finished_at");
    expect(lines.slice(1, -1).map((l) => l.split(",")[0])).toEqual([...ids].reverse());
    expect(lines[1]).toBe(`${ids[1]},decide,${member.keyId},paid,0.001,0.00025,settled,2030-06-02T00:00:00.000Z,2030-06-02T00:00:00.010Z`);
    expect(lines.at(-1)).toBe("");

    const signedOut = await fetch(`${service.url}/account/v1/usage.csv`);
    expect(signedOut.status).toBe(401);
    expect(await signedOut.json()).toMatchObject({ code: 40102, data: { reason: "SIGNED_OUT" } });
    const apiKeyOnly = await fetch(`${service.url}/account/v1/usage.csv`, { headers: { authorization: `Bearer ${member.apiKey}` } });
    expect(apiKeyOnly.status).toBe(401);
    const crossSite = await fetch(`${service.url}/account/v1/usage.csv`, { headers: { cookie, "sec-fetch-site": "cross-site" } });
    expect(crossSite.status).toBe(403);
    const badDate = await fetch(`${service.url}/account/v1/usage.csv?until=yesterday`, { headers: { cookie } });
    expect(badDate.status).toBe(400);
    expect(await badDate.json()).toMatchObject({ data: { reason: "INVALID_ARGUMENT", field: "until" } });
    const posted = await fetch(`${service.url}/account/v1/usage.csv`, { method: "POST", headers: { cookie } });
    expect(posted.status).toBe(405);
    expect(posted.headers.get("allow")).toBe("GET");
  });

  it("lists released and expired calls with their status, and never a call still running", async () => {
    const member = await signedInMember();
    const start = (now: Date) => admit(database.db, { keyHash: hashApiKey(member.apiKey), endpoint: "decide", reserveUnits: 500, freeAllowed: false, leaseMs: 60_000, now });
    const t0 = Date.UTC(2031, 0, 1);
    const released = await start(new Date(t0));
    if (released.outcome !== "admitted") throw new Error(released.outcome);
    await finish(database.db, { requestId: released.requestId, success: false, now: new Date(t0 + 1_000) });
    const abandoned = await start(new Date(t0 + 10_000));
    // Its lease has passed when the next call is admitted: that admission expires it.
    const running = await start(new Date(t0 + 200_000));
    if (abandoned.outcome !== "admitted" || running.outcome !== "admitted") throw new Error("not admitted");
    const { records } = await member.client.listUsage({});
    expect(records.map((r) => [r.requestId, r.status, r.reservedCredits, r.chargedCredits])).toEqual([
      [abandoned.requestId, "expired", 0.0005, 0],
      [released.requestId, "released", 0.0005, 0],
    ]);
    const { account } = await member.client.getAccount({});
    expect(account).toMatchObject({ callsInFlight: 1, heldCredits: 0.0005, balanceCredits: 10, availableCredits: 9.9995 });
    expect(timestampDate(account!.createdAt!).getTime()).toBe((await database.db("accounts").where({ id: member.accountId }).first("created_at")).created_at.getTime());
  });

  it("records the key of each call in its row, on the batch admission path too", async () => {
    const member = await signedInMember();
    const other = await database.db("api_keys").where({ account_id: member.accountId }).first("id");
    const admissions = await admitMany(
      database.db,
      [0, 1].map(() => ({ keyHash: hashApiKey(member.apiKey), endpoint: "search" as const, reserveUnits: 0, freeAllowed: false, leaseMs: 60_000 })),
      undefined,
    );
    const ids = admissions.map((a) => (a.outcome === "admitted" ? a.requestId : a.outcome));
    const rows = await database.db("requests").whereIn("id", ids).pluck("key_id");
    expect(rows).toEqual([other.id, other.id]);
  });
});

describe("activity", () => {
  it("pages newest first", async () => {
    const member = await signedInMember();
    for (let i = 0; i < 4; i++) {
      service.clock.advance(1_000);
      await member.client.createKey({ name: `k${i}` });
    }
    const first = await member.client.listActivity({ pageSize: 3 });
    const second = await member.client.listActivity({ pageSize: 3, pageToken: first.nextPageToken });
    expect([...first.events, ...second.events].map((e) => [e.kind, e.detail.replace(/^.*\(|\)$/g, "")])).toEqual([
      ["key_created", "k3"],
      ["key_created", "k2"],
      ["key_created", "k1"],
      ["key_created", "k0"],
      ["invite_accepted", "as member"],
    ]);
    expect(second.nextPageToken).toBe("");
  });
});

describe("bad input is a 400 naming the field", () => {
  it.each([
    ["listUsage", "endpoint", { endpoint: "everything" }],
    ["listUsage", "page_size", { pageSize: 501 }],
    ["listUsage", "page_size", { pageSize: -1 }],
    ["listUsage", "page_token", { pageToken: "not a token" }],
    ["listUsage", "since", { since: { seconds: 200n }, until: { seconds: 100n } }],
    ["getUsageSummary", "granularity", { granularity: "week" }],
    ["getUsageSummary", "since", { granularity: "hour", since: { seconds: 0n }, until: { seconds: 32n * 86_400n } }],
    ["listActivity", "page_size", { pageSize: 1000 }],
    ["listActivity", "page_token", { pageToken: Buffer.from(JSON.stringify(["2030-01-01T00:00:00Z", "abc"])).toString("base64url") }],
    ["createKey", "name", { name: "x".repeat(65) }],
    ["createKey", "name", { name: "tab\there" }],
  ] as const)("%s: INVALID_ARGUMENT on %s (case %#)", async (method, field, request) => {
    const member = await signedInMember();
    const call = (member.client[method] as (r: unknown) => Promise<unknown>)(request);
    const refused = await refusal(call);
    expect(refused).toMatchObject({ code: Code.InvalidArgument, reason: "INVALID_ARGUMENT" });
    expect(refused.message).toMatch(new RegExp(`^${field}: `));
  });

  it("sign-in and invite fields", async () => {
    const { client } = accountClient(service.url);
    expect((await refusal(client.signIn({ email: "", password: "x" }))).message).toMatch(/^email: /);
    expect((await refusal(client.signIn({ email: "a@b.c", password: "" }))).message).toMatch(/^password: /);
    expect((await refusal(client.signIn({ email: "a@b.c", password: "x".repeat(257) }))).message).toMatch(/^password: /);
    expect((await refusal(client.acceptInvite({ inviteToken: "", password: PASSWORD }))).message).toMatch(/^invite_token: /);
    expect((await refusal(client.acceptInvite({ inviteToken: "x", password: "x".repeat(257) }))).message).toBe("password: at most 256 characters");
  });
});

describe("behind an https public URL", () => {
  it("the cookie is Secure and __Host- prefixed, and the public origin may call", async () => {
    const secure = await startAccountApp(database, { TYPESAFE_PUBLIC_URL: "https://account.example.com/" });
    try {
      const { accountId } = await createTestAccount(database.db);
      const { token } = await inviteMember(database.db, accountId, uniqueEmail("tls"), secure.clock.now());
      const { client, jar } = accountClient(secure.url, { headers: { origin: "https://account.example.com" } });
      await client.acceptInvite({ inviteToken: token, password: PASSWORD });
      expect(jar.received[0]).toMatch(/^__Host-typesafe_session=[A-Za-z0-9_-]{43}; Path=\/; HttpOnly; SameSite=Strict; Secure; Max-Age=43200$/);
      expect((await client.getAccount({})).account?.id).toBe(accountId);
      const { client: plain } = accountClient(secure.url, { headers: { cookie: `typesafe_session=${jar.cookies.get("__Host-typesafe_session")}` } });
      expect((await refusal(plain.getAccount({}))).reason).toBe("SIGNED_OUT");
    } finally {
      await secure.stop();
    }
  });
});
