import type { Knex } from "knex";
import { createClient, ConnectError, type Client, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { startApp, type App } from "../../src/app.js";
import { loadConfig } from "../../src/config.js";
import { createLogger } from "../../src/logger.js";
import { createInvite } from "../../src/team/invites.js";
import { ensureMember } from "../../src/team/members.js";
import type { ScryptParams } from "../../src/sign-in/passwords.js";
import type { Role } from "../../src/team/roles.js";
import { AccountService } from "../../src/gen/typesafe/account/v1/account_service_pb.js";
import { ErrorDetailSchema } from "../../src/gen/typesafe/error/v1/error_pb.js";
import type { TestDatabase } from "../support/database.js";

/** A clock the test moves by hand: sessions and invites expire without sleeping. */
export interface TestClock {
  now: () => Date;
  advance(ms: number): void;
}

export function createTestClock(start = new Date()): TestClock {
  let at = start.getTime();
  return { now: () => new Date(at), advance: (ms) => void (at += ms) };
}

/** Cheaper scrypt for tests that sign in often; the production cost is pinned in passwords.test.ts. */
export const TEST_SCRYPT = { N: 1024, r: 8, p: 1, keyBytes: 32, saltBytes: 16 };

export interface AccountTestApp {
  app: App;
  url: string;
  clock: TestClock;
  logLines: string[];
  stop(): Promise<void>;
}

/** The real service on port 0 with a hand-moved clock for the account area. */
export async function startAccountApp(
  database: TestDatabase,
  env: Record<string, string> = {},
  options: { scryptParams?: ScryptParams } = {},
): Promise<AccountTestApp> {
  const config = loadConfig({
    PORT: "0",
    TYPESAFE_LOG_LEVEL: "info",
    TYPESAFE_SHUTDOWN_GRACE_MS: "2000",
    TYPESAFE_DB_POOL_MAX: database.isExternal ? "10" : "4",
    TYPESAFE_SEARCH_SOURCES: "none",
    TYPESAFE_LLM_EMBEDDED: "off",
    // Nor run evaluations: on the shared embedded store, a runner would take other files' evaluations. A test that wants one says so.
    TYPESAFE_EVALUATION_EXAMPLES_IN_FLIGHT: "0",
    ...env,
    DATABASE_URL: database.url,
  });
  const clock = createTestClock();
  const logLines: string[] = [];
  const app = await startApp(config, createLogger(config.logLevel, {}, (line) => logLines.push(line)), { now: clock.now, scryptParams: options.scryptParams ?? TEST_SCRYPT });
  return { app, url: app.server.url, clock, logLines, stop: () => app.stop() };
}

/** A browser's cookie jar, as far as one cookie goes: what Set-Cookie gave is sent back as Cookie. */
export interface CookieJar {
  cookies: Map<string, string>;
  /** Every Set-Cookie value received, in order. */
  received: string[];
  interceptor: Interceptor;
}

export function createCookieJar(): CookieJar {
  const cookies = new Map<string, string>();
  const received: string[] = [];
  const remember = (headers: Headers) => {
    for (const line of headers.getSetCookie()) {
      received.push(line);
      const [pair, ...attributes] = line.split(";");
      const [name, value] = [pair!.slice(0, pair!.indexOf("=")).trim(), pair!.slice(pair!.indexOf("=") + 1)];
      if (attributes.some((a) => a.trim().toLowerCase() === "max-age=0") || value === "") cookies.delete(name);
      else cookies.set(name, value);
    }
  };
  const interceptor: Interceptor = (next) => async (req) => {
    if (cookies.size > 0) req.header.set("cookie", [...cookies].map(([n, v]) => `${n}=${v}`).join("; "));
    try {
      const res = await next(req);
      remember(res.header);
      return res;
    } catch (err) {
      if (err instanceof ConnectError) remember(err.metadata);
      throw err;
    }
  };
  return { cookies, received, interceptor };
}

export type AccountClient = Client<typeof AccountService>;

/** A Connect (JSON) client of the account area with its own cookie jar and optional extra headers. */
export function accountClient(
  url: string,
  options: { headers?: Record<string, string>; protocol?: "connect" | "connect-binary" | "grpc-web" | "grpc"; jar?: CookieJar } = {},
): { client: AccountClient; jar: CookieJar } {
  const jar = options.jar ?? createCookieJar();
  const headers: Interceptor = (next) => (req) => {
    for (const [name, value] of Object.entries(options.headers ?? {})) req.header.set(name, value);
    return next(req);
  };
  const interceptors = [headers, jar.interceptor];
  const protocol = options.protocol ?? "connect";
  const transport =
    protocol === "grpc"
      ? createGrpcTransport({ baseUrl: url, interceptors })
      : protocol === "grpc-web"
        ? createGrpcWebTransport({ baseUrl: url, httpVersion: "1.1", interceptors })
        : createConnectTransport({ baseUrl: url, httpVersion: "1.1", interceptors, useBinaryFormat: protocol === "connect-binary" });
  return { client: createClient(AccountService, transport), jar };
}

/** Invites a member as the CLI does (same functions), returning the token; a role other than the default "member" when given. */
export async function inviteMember(db: Knex, accountId: string, email: string, now: Date, role?: Role): Promise<{ memberId: string; token: string }> {
  return db.transaction(async (tx) => {
    const member = await ensureMember(tx, accountId, email, role);
    if (!member) throw new Error(`${email} belongs to another account`);
    const { token } = await createInvite(tx, member.id, now);
    return { memberId: member.id, token };
  });
}

/** The reason and status of a refused call, for assertions. */
export async function refusal(
  call: Promise<unknown>,
): Promise<{ code: number; reason: string; message: string; field: string; rule: string; metadata: Headers; detailMetadata: Record<string, string> }> {
  try {
    await call;
  } catch (err) {
    if (!(err instanceof ConnectError)) throw err;
    const detail = err.findDetails(ErrorDetailSchema)[0];
    return { code: err.code, reason: detail?.reason ?? "", message: err.rawMessage, field: detail?.field ?? "", rule: detail?.rule ?? "", metadata: err.metadata, detailMetadata: { ...detail?.metadata } };
  }
  throw new Error("the call succeeded");
}

/** A unique email per test. */
export function uniqueEmail(label: string): string {
  return `${label}-${Math.random().toString(36).slice(2, 10)}@example.com`;
}
