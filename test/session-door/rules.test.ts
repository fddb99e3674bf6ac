import { describe, expect, it } from "vitest";
import { clearSessionCookie, readSessionToken, sessionCookieFor, setSessionCookie } from "../../src/session-door/cookie.js";
import { isCrossSite, listeningOrigins } from "../../src/session-door/origin.js";
import { kMember, memberOf } from "../../src/session-door/door.js";
import { createHandlerContext } from "@connectrpc/connect";
import { AccountService } from "../../src/gen/typesafe/account/v1/account_service_pb.js";
import { csvField } from "../../src/session-door/usage-csv.js";
import { callCursor, decodePageToken, encodePageToken, pageSize, usageFilter } from "../../src/metering/usage-query.js";
import { emailProblem, normalizeEmail } from "../../src/team/members.js";
import { createDummyHash, hashPassword, passwordProblem, SCRYPT_PARAMS, verifyPassword } from "../../src/sign-in/passwords.js";
import { generateToken, hashToken, isWellFormedToken } from "../../src/sign-in/secret-tokens.js";
import { TEST_SCRYPT } from "./support.js";

/** The account area's pure rules, table by table. */

describe("passwords", () => {
  it.each([
    ["", "at least 12 characters"],
    ["elevenchars", "at least 12 characters"],
    ["twelve chars", undefined],
    ["ünïcödé pass", undefined],
    ["😀".repeat(11), "at least 12 characters"],
    ["😀".repeat(12), undefined],
    ["x".repeat(256), undefined],
    ["x".repeat(257), "at most 256 characters"],
  ])("%j -> %s", (password, problem) => {
    expect(passwordProblem(password)).toBe(problem);
  });

  it("are stored as scrypt with OWASP's parameters, a fresh salt each time, and verified only by the right password", async () => {
    const first = await hashPassword("correct horse battery");
    const second = await hashPassword("correct horse battery");
    expect(first).toMatch(/^scrypt\$131072\$8\$1\$[A-Za-z0-9_-]{22}\$[A-Za-z0-9_-]{43}$/);
    expect(SCRYPT_PARAMS).toEqual({ N: 131_072, r: 8, p: 1, keyBytes: 32, saltBytes: 16 });
    expect(second.split("$")[4]).not.toBe(first.split("$")[4]);
    expect(second.split("$")[5]).not.toBe(first.split("$")[5]);
    expect(await verifyPassword("correct horse battery", first)).toBe(true);
    expect(await verifyPassword("correct horse batterY", first)).toBe(false);
  });

  it("keep the parameters they were made with", async () => {
    const cheap = await hashPassword("correct horse battery", TEST_SCRYPT);
    expect(cheap).toMatch(/^scrypt\$1024\$8\$1\$/);
    expect(await verifyPassword("correct horse battery", cheap)).toBe(true);
    expect(await verifyPassword("correct horse battery", cheap.replace("$1024$", "$2048$"))).toBe(false);
  });

  it("NFC and NFD spellings of one password match", async () => {
    const stored = await hashPassword("caf\u00e9 au lait!!", TEST_SCRYPT);
    expect(await verifyPassword("cafe\u0301 au lait!!", stored)).toBe(true);
  });

  it.each([
    ["empty", ""],
    ["another scheme", "bcrypt$10$abc"],
    ["N not a power of two", "scrypt$1000$8$1$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"],
    ["N too large", `scrypt$${2 ** 20}$8$1$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA`],
    ["N and r together too large", `scrypt$${2 ** 15}$128$1$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA`],
    ["N of 1", "scrypt$1$8$1$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"],
    ["r of 0", "scrypt$1024$0$1$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"],
    ["p of 0", "scrypt$1024$8$0$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"],
    ["p too large", "scrypt$1024$8$17$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"],
    ["a short hash", "scrypt$1024$8$1$AAAAAAAAAAAAAAAAAAAAAA$AAAA"],
    ["trailing text", "scrypt$1024$8$1$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA$x"],
  ])("a stored form that is %s never matches", async (_, stored) => {
    expect(await verifyPassword("", stored, TEST_SCRYPT)).toBe(false);
    expect(await verifyPassword("anything at all", stored, TEST_SCRYPT)).toBe(false);
  });

  it("the right password does not verify against a stored form with text around it or parameters out of range", async () => {
    const stored = await hashPassword("correct horse battery", TEST_SCRYPT);
    expect(await verifyPassword("correct horse battery", `x${stored}`, TEST_SCRYPT)).toBe(false);
    expect(await verifyPassword("correct horse battery", `${stored}$x`, TEST_SCRYPT)).toBe(false);
    for (const params of [
      { N: 16, r: 1, p: 17, keyBytes: 32, saltBytes: 16 },
      { N: 16, r: 1, p: 1, keyBytes: 15, saltBytes: 16 },
    ]) {
      expect(await verifyPassword("correct horse battery", await hashPassword("correct horse battery", params), TEST_SCRYPT)).toBe(false);
    }
  });

  it("a stored form with odd but valid parameters verifies when it was made with them", async () => {
    const stored = await hashPassword("correct horse battery", { N: 2, r: 1, p: 1, keyBytes: 16, saltBytes: 8 });
    expect(await verifyPassword("correct horse battery", stored)).toBe(true);
    const wide = await hashPassword("correct horse battery", { N: 16, r: 64, p: 16, keyBytes: 32, saltBytes: 16 });
    expect(await verifyPassword("correct horse battery", wide)).toBe(true);
  });

  it("the dummy hash takes the parameters it is given and matches nothing anyone types", async () => {
    const dummy = createDummyHash(TEST_SCRYPT);
    expect(dummy).toMatch(/^scrypt\$1024\$8\$1\$[A-Za-z0-9_-]{22}\$[A-Za-z0-9_-]{43}$/);
    expect(await verifyPassword("", dummy)).toBe(false);
    expect(createDummyHash()).toMatch(/^scrypt\$131072\$8\$1\$/);
    expect(createDummyHash()).not.toBe(createDummyHash());
  });

  it("the dummy hash is made without scrypt (whose 128 MiB were the service's peak memory at start): twenty cost less than one real hash", async () => {
    const started = performance.now();
    for (let i = 0; i < 20; i++) await createDummyHash();
    const twentyDummiesMs = performance.now() - started;
    const hashStarted = performance.now();
    await hashPassword("correct horse battery", SCRYPT_PARAMS);
    expect(twentyDummiesMs).toBeLessThan(performance.now() - hashStarted);
  });
});

describe("tokens", () => {
  it("are 32 random bytes in base64url, hashed with SHA-256 for storage", () => {
    const token = generateToken();
    expect(token).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(Buffer.from(token, "base64url")).toHaveLength(32);
    expect(generateToken()).not.toBe(token);
    expect(hashToken(token).toString("hex")).toMatch(/^[0-9a-f]{64}$/);
    expect(hashToken(token).equals(hashToken(token))).toBe(true);
    expect(isWellFormedToken(token)).toBe(true);
  });

  it.each(["", "A".repeat(42), "A".repeat(44), `${"A".repeat(42)}=`, `${"A".repeat(42)}+`, ` ${"A".repeat(42)}`])("%j is not well formed", (token) => {
    expect(isWellFormedToken(token)).toBe(false);
  });
});

describe("the session cookie", () => {
  const plain = sessionCookieFor("http://127.0.0.1:8080");
  const secure = sessionCookieFor("https://api.example.com/base");

  it("is HttpOnly, SameSite=Strict, Path=/, and Secure with the __Host- prefix over https", () => {
    expect(plain).toEqual({ name: "typesafe_session", secure: false });
    expect(secure).toEqual({ name: "__Host-typesafe_session", secure: true });
    expect(setSessionCookie(plain, "T", 43_200_999)).toBe("typesafe_session=T; Path=/; HttpOnly; SameSite=Strict; Max-Age=43200");
    expect(setSessionCookie(secure, "T", 60_000)).toBe("__Host-typesafe_session=T; Path=/; HttpOnly; SameSite=Strict; Secure; Max-Age=60");
    expect(clearSessionCookie(secure)).toBe("__Host-typesafe_session=; Path=/; HttpOnly; SameSite=Strict; Secure; Max-Age=0");
  });

  it.each([
    [undefined, undefined],
    ["", undefined],
    ["typesafe_session=abc", "abc"],
    ["other=1; typesafe_session=abc; more=2", "abc"],
    ["other=1;typesafe_session=abc", "abc"],
    ["typesafe_session=", undefined],
    ["typesafe_session=a; typesafe_session=b", undefined],
    ["xtypesafe_session=abc", undefined],
    ["typesafe_sessionx=abc", undefined],
    ["__Host-typesafe_session=abc", undefined],
  ])("%j -> %j", (header, token) => {
    expect(readSessionToken(plain, header)).toBe(token);
  });
});

describe("cross-site requests", () => {
  const allowed = new Set(["https://api.example.com"]);
  it.each([
    [{}, false],
    [{ origin: "https://api.example.com" }, false],
    // Scheme, host and port are all compared with the public origin; the Host header plays no part.
    [{ origin: "http://api.example.com" }, true],
    [{ origin: "https://api.example.com:8443" }, true],
    [{ origin: "https://API.example.com" }, true],
    [{ origin: "https://api.example.com/" }, true],
    [{ origin: "https://evil.example" }, true],
    [{ origin: "https://api.example.com.evil.example" }, true],
    [{ origin: "null" }, true],
    [{ origin: "not a url" }, true],
    [{ origin: "http://127.0.0.1:8080" }, true],
    [{ "sec-fetch-site": "same-origin" }, false],
    [{ "sec-fetch-site": "none" }, false],
    [{ "sec-fetch-site": "same-site" }, true],
    [{ "sec-fetch-site": "cross-site" }, true],
    [{ "sec-fetch-site": "cross-site", origin: "https://api.example.com" }, true],
    [{ "sec-fetch-site": "same-origin", origin: "http://api.example.com" }, true],
  ])("%j -> cross-site %s", (headers, crossSite) => {
    expect(isCrossSite(new Headers(headers as Record<string, string>), allowed)).toBe(crossSite);
  });

  it.each([
    ["127.0.0.1", 8080, ["http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8080"]],
    ["::1", 8080, ["http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8080"]],
    ["10.0.0.5", 80, ["http://10.0.0.5"]],
    ["0.0.0.0", 8080, ["http://0.0.0.0:8080"]],
  ])("without a public URL, a service listening on %s:%s is called from %j", (host, port, origins) => {
    expect(listeningOrigins(host, port)).toEqual(origins);
  });
});

describe("the door", () => {
  it("memberOf refuses a context the door did not sign in", () => {
    const ctx = createHandlerContext({
      service: AccountService,
      method: AccountService.method.getAccount,
      protocolName: "test",
      requestMethod: "POST",
      url: "http://localhost/",
    });
    expect(() => memberOf(ctx)).toThrow(/^\[unauthenticated\] not signed in, or the session ended: sign in to the account area$/);
    const member = { memberId: "m", accountId: "a", email: "e" };
    ctx.values.set(kMember, member);
    expect(memberOf(ctx)).toBe(member);
  });
});

describe("usage queries", () => {
  it("page tokens round-trip and refuse anything else", () => {
    const at = new Date("2030-01-02T03:04:05.678Z");
    const id = "0b4e1a2c-1111-4222-8333-944455556666";
    const token = encodePageToken(at, id);
    expect(decodePageToken(token)).toEqual({ at, id });
    expect(callCursor(token)).toEqual({ startedAt: at, requestId: id });
    expect(decodePageToken("")).toBeUndefined();
    expect(callCursor("")).toBeUndefined();
    const refuse = (t: string) => expect(() => callCursor(t)).toThrow(/^\[invalid_argument\] page_token: the next_page_token of an earlier page$/);
    for (const bad of ["x", "!!", Buffer.from("[1,2]").toString("base64url"), Buffer.from('["nope","a"]').toString("base64url"), encodePageToken(at, "12"), Buffer.from(JSON.stringify([at.toISOString(), id, 1])).toString("base64url"), Buffer.from(JSON.stringify([at.toISOString(), "x".repeat(37)])).toString("base64url")]) {
      refuse(bad);
    }
    expect(decodePageToken(encodePageToken(at, "12"))).toEqual({ at, id: "12" });
  });

  it.each([
    [0, 50],
    [1, 1],
    [500, 500],
  ])("page size %i -> %i", (asked, used) => {
    expect(pageSize(asked)).toBe(used);
  });

  it.each([-1, 501])("page size %i is refused", (asked) => {
    expect(() => pageSize(asked)).toThrow(/^\[invalid_argument\] page_size: from 1 to 500, or 0 for 50$/);
  });

  it("filters: endpoint names and time order", () => {
    const a = new Date(1_000);
    const b = new Date(2_000);
    expect(usageFilter({ endpoint: "" })).toEqual({ endpoint: undefined, since: undefined, until: undefined });
    expect(usageFilter({ endpoint: "search", since: a, until: b })).toEqual({ endpoint: "search", since: a, until: b });
    expect(usageFilter({ endpoint: "decide", since: a })).toEqual({ endpoint: "decide", since: a, until: undefined });
    expect(() => usageFilter({ endpoint: "Decide" })).toThrow(/endpoint: one of/);
    expect(() => usageFilter({ endpoint: "", since: b, until: a })).toThrow(/since: must be before until/);
    expect(() => usageFilter({ endpoint: "", since: a, until: a })).toThrow(/since: must be before until/);
  });
});

describe("CSV fields (RFC 4180)", () => {
  it.each([
    ["plain", "plain"],
    ["", ""],
    ["a,b", '"a,b"'],
    ['say "hi"', '"say ""hi"""'],
    ["two\nlines", '"two\nlines"'],
    ["cr\r", '"cr\r"'],
    ["=SUM(A1)", `"'=SUM(A1)"`],
    ["+1", `"'+1"`],
    ["@x", `"'@x"`],
    ["-x", `"'-x"`],
    // OWASP: every cell that starts with one of these is escaped, numbers-looking ones too.
    ["-1+1|cmd", `"'-1+1|cmd"`],
    ["-1.5", `"'-1.5"`],
    ["+1+cmd|' /C calc'!A0", `"'+1+cmd|' /C calc'!A0"`],
    ["\t=1", `"'\t=1"`],
    ["\r=1", `"'\r=1"`],
    ["a;b", '"a;b"'],
    ["0.00025", "0.00025"],
  ])("%j -> %s", (value, field) => {
    expect(csvField(value)).toBe(field);
  });
});

describe("emails", () => {
  it.each([
    ["a@b.c", undefined],
    ["A.Person+tag@Example.COM", undefined],
    ["no-at-sign", "an email address (name@domain)"],
    ["two@@signs", "an email address (name@domain)"],
    ["@domain", "an email address (name@domain)"],
    ["name@", "an email address (name@domain)"],
    ["sp ace@b.c", "an email address (name@domain)"],
    [`${"a".repeat(250)}@b.cd`, "at most 254 characters"],
    [`${"a".repeat(249)}@b.cd`, undefined],
  ])("%j -> %s", (email, problem) => {
    expect(emailProblem(email)).toBe(problem);
  });

  it("are compared trimmed and in lower case", () => {
    expect(normalizeEmail("  A.Person@Example.COM ")).toBe("a.person@example.com");
  });
});
