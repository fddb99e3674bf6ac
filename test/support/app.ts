import type { Knex } from "knex";
import { startApp, type App, type AppOverrides } from "../../src/app.js";
import { createApiKey } from "../../src/keys/store.js";
import { createAccount } from "../../src/admin/account-funding.js";
import { loadConfig, type Config } from "../../src/config.js";
import { createLogger } from "../../src/logger.js";
import type { TestDatabase } from "./database.js";
import { checkAnswersOf } from "./openapi-conformance.js";

export interface TestApp {
  app: App;
  url: string;
  stop(): Promise<void>;
}

/** The real service, in-process on port 0, against a test database, with extra environment. */
export async function startTestApp(
  database: TestDatabase,
  env: Record<string, string> = {},
  options: { onLogLine?: (line: string) => void; overrides?: AppOverrides; configure?: (config: Config) => void } = {},
): Promise<TestApp> {
  const config = loadConfig({
    PORT: "0",
    TYPESAFE_LOG_LEVEL: "silent",
    TYPESAFE_SHUTDOWN_GRACE_MS: "2000",
    TYPESAFE_DB_POOL_MAX: database.isExternal ? "10" : "4",
    // Tests never reach the real providers: a test enables the sources it points at its fakes.
    TYPESAFE_SEARCH_SOURCES: "none",
    // Nor a model download: a test that wants the embedded model names its file.
    TYPESAFE_LLM_EMBEDDED: "off",
    // Nor run evaluations: on the shared embedded store, a runner would take other files' evaluations. A test that wants one says so.
    TYPESAFE_EVALUATION_EXAMPLES_IN_FLIGHT: "0",
    ...env,
    DATABASE_URL: database.url,
  });
  // What no variable sets: the pinned model's size and SHA-256, for a test that serves its own file.
  options.configure?.(config);
  const app = await startApp(config, createLogger(config.logLevel, {}, options.onLogLine), options.overrides);
  checkAnswersOf(app.server.url);
  return { app, url: app.server.url, stop: () => app.stop() };
}

/** A fresh account with one key; money in integer units. */
export async function createTestAccount(
  db: Knex,
  init: { units?: number; freeRequests?: number; name?: string } = {},
): Promise<{ accountId: string; apiKey: string; keyId: string }> {
  const account = await createAccount(db, { name: init.name ?? "test", units: init.units ?? 0, freeRequests: init.freeRequests ?? 0 });
  const { apiKey, keyId } = await createApiKey(db, account.id);
  return { accountId: account.id, apiKey, keyId };
}

/** An account's balance in integer units, read from its row. */
export async function balanceUnits(db: Knex, accountId: string): Promise<number> {
  const row = await db("accounts").where({ id: accountId }).first("balance");
  return Number(row.balance);
}

/** POSTs JSON (or a raw string body) and returns status, headers and the parsed envelope. */
export async function postJson(
  url: string,
  body: unknown,
  init: { apiKey?: string; headers?: Record<string, string>; signal?: AbortSignal } = {},
): Promise<{ status: number; headers: Headers; body: { code: number; message: string; data: Record<string, unknown> } }> {
  const response = await fetch(url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      ...(init.apiKey ? { authorization: `Bearer ${init.apiKey}` } : {}),
      ...init.headers,
    },
    body: typeof body === "string" ? body : JSON.stringify(body),
    signal: init.signal,
  });
  return { status: response.status, headers: response.headers, body: await response.json() };
}
