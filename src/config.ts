import fs from "node:fs";
import path from "node:path";
import type { LogLevel } from "./logger.js";
import { ConfigError } from "./config-error.js";
import { DatabaseUrlError, parseDatabaseUrl } from "./db/connection-string.js";
import { parseSourceCatalog } from "./search/source-config.js";
import type { SettingRead } from "./setting-read.js";

/**
 * The whole configuration, parsed once from the environment. This is the only
 * module that reads process.env; every problem is reported at once.
 */
export interface Config {
  host: string;
  port: number;
  /** External PostgreSQL; when absent the embedded PGlite store is used. */
  databaseUrl: string | undefined;
  /** Folder of the embedded store (and its socket file). */
  dataDir: string;
  /** Connections to an external PostgreSQL (the embedded store always uses one). */
  dbPoolMax: number;
  logLevel: LogLevel | "silent";
  /** GET /metrics and the collection behind it (TYPESAFE_METRICS=off turns both off). */
  metrics: boolean;
  /** How long SIGTERM waits for in-flight calls before releasing their holds. */
  shutdownGraceMs: number;
  /** Maximum body size of the JSON gateway and of RPC messages. */
  maxBodyBytes: number;
  connections: ConnectionLimits;
  /** Unary gRPC over HTTP/2 on its short path (TYPESAFE_GRPC_SHORT_PATH=off sends it through Connect's handler, to compare the two). */
  grpcShortPath: boolean;
  metering: MeteringConfig;
  account: AccountAreaConfig;
  llm: LlmConfig;
  search: SearchConfig;
  webhooks: WebhookConfig;
  evaluations: EvaluationConfig;
}

/** How this replica runs evaluations in the background. */
export interface EvaluationConfig {
  /** Examples this replica asks at once, over every evaluation: the API's calls keep the rest of the upstream's slots. */
  examplesInFlight: number;
  /** How often the runner looks for examples to run when nothing woke it. */
  pollIntervalMs: number;
}

/** How the account's events are delivered to its webhook endpoints. */
export interface WebhookConfig {
  /** Loopback endpoints are allowed: for local development and tests only; every other private range stays refused. */
  allowLoopback: boolean;
  /** One attempt, from resolving the host to the answer: a 2xx within this is a delivery. */
  timeoutMs: number;
  /** Waits after the first, second, ... failed attempt; when they run out the delivery fails and the endpoint is disabled. */
  retryDelaysMs: number[];
  /** How often each replica looks for deliveries that are due. */
  pollIntervalMs: number;
  /** How often each replica records `key.expiring` for keys that expire within 7 days. */
  keyExpiryCheckMs: number;
  /** DNS servers asked for endpoint names ("host" or "host:port"); the system resolver when empty. */
  dnsServers: string[];
}

/** The retry schedule of the Standard Webhooks specification: about three days in nine retries. */
export const DEFAULT_WEBHOOK_RETRY_DELAYS_MS = [5e3, 3e5, 18e5, 72e5, 18e6, 36e6, 504e5, 72e6, 864e5];

/**
 * What a client connection may hold: each timeout closes a connection (or an
 * HTTP/2 stream) that stopped making progress, and the cap refuses new
 * connections before file descriptors run out.
 */
export interface ConnectionLimits {
  /** From accept until a whole HTTP/1.1 request head, or an HTTP/2 session's first stream, has arrived. */
  headersTimeoutMs: number;
  /** Longest pause between two reads of a request body, on HTTP/1.1 and on each HTTP/2 stream. */
  bodyTimeoutMs: number;
  /** How long a connection with no request or stream in progress stays open. */
  idleTimeoutMs: number;
  /** How long an HTTP/1.1 body is still read and discarded after an answer that did not wait for it (nginx's lingering_time). */
  lingerTimeMs: number;
  /** Open connections at most; one more is closed as soon as it is accepted. */
  maxConnections: number;
}

/** How calls are charged: holds, their leases, and the deadline of each ledger statement. */
export interface MeteringConfig {
  /** Free requests given to an account created without --free-requests. */
  defaultFreeRequests: number;
  /** Added to a call's deadline to form the lease of its hold. */
  leaseMarginMs: number;
  /** How often each replica releases expired holds. */
  sweepIntervalMs: number;
  /** Client-side deadline of one metering statement; a lost reply ends here and the call asks again. */
  statementTimeoutMs: number;
  /** How often each replica counts closed hours of calls into the usage roll-up. */
  rollupIntervalMs: number;
  /** How long after its end an hour of calls may be rolled up: longer than an admission takes to commit. */
  rollupDelayMs: number;
}

/** The account area: where people reach it, its password work, keys and sessions. */
export interface AccountAreaConfig {
  /**
   * Where people reach this service (TYPESAFE_PUBLIC_URL): invite links start
   * with it, its origin is the one site whose pages may make state-changing
   * calls, and when it is https the session cookie is Secure.
   */
  publicUrl: string;
  /**
   * True when TYPESAFE_PUBLIC_URL was set; else the public URL is the listening
   * address (its real port once bound): right for the service, a guess for the CLI.
   */
  publicUrlConfigured: boolean;
  /** Password hashes (scrypt) computed at once, waiting, and per client (TYPESAFE_PASSWORD_CHECKS_*). */
  passwordWork: { concurrent: number; queued: number; perClient: number };
  /** Live (unrevoked) keys one account may have (TYPESAFE_MAX_KEYS_PER_ACCOUNT). */
  maxKeysPerAccount: number;
  /** A session unused this long ends (OWASP suggests 15-30 minutes for low-risk sites). */
  sessionIdleMs: number;
  /** A session ends this long after sign-in, however busy. */
  sessionAbsoluteMs: number;
}

/** The model that answers decisions, and how it is called: the upstream at `baseUrl`, else the embedded one. */
export interface LlmConfig {
  baseUrl: string | undefined;
  apiKey: string | undefined;
  model: string;
  /** Deadline of a whole Decide call. */
  requestTimeoutMs: number;
  /** Timeout of one upstream HTTP call. */
  callTimeoutMs: number;
  /** Per-process cap on concurrent upstream calls. */
  maxConcurrentCalls: number;
  maxRetries: number;
  /** The model run in this process when `baseUrl` is unset. */
  embedded: EmbeddedModelConfig;
}

/**
 * The embedded model: a GGUF file run through llama.cpp's CPU build.
 * Fetched once into the data folder from a revision-pinned address and
 * checked against the pinned size and SHA-256, unless `modelPath` names a
 * local file.
 */
export interface EmbeddedModelConfig {
  /** TYPESAFE_LLM_EMBEDDED=off turns it off: decisions then need TYPESAFE_LLM_BASE_URL. */
  enabled: boolean;
  /** A local GGUF file, used as it is: nothing is fetched or pinned. */
  modelPath: string | undefined;
  /** Where the pinned file is fetched from (a mirror must serve the same bytes). */
  modelUrl: string;
  modelBytes: number;
  modelSha256: string;
  /** The file's name in the data folder. */
  modelFileName: string;
  /** The longest prompt one question may have, in tokens. */
  contextTokens: number;
  /** Questions evaluated side by side; each holds a cache of up to 2,048 tokens. */
  sequences: number;
  /** CPU threads for llama.cpp; 0: the machine's physical cores. */
  threads: number;
  /** The longest a decision may be given while its tokens and those queued ahead are evaluated; a call estimated longer is refused at once. */
  maxWaitMs: number;
}

/**
 * Qwen2.5-0.5B-Instruct (Apache-2.0), Q4_K_M, at a fixed revision of Qwen's
 * own GGUF repository; size and SHA-256 as that revision's LFS pointer gives them.
 */
export const DEFAULT_EMBEDDED_MODEL = {
  url: "https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF/resolve/9217f5db79a29953eb74d5343926648285ec7e67/qwen2.5-0.5b-instruct-q4_k_m.gguf",
  bytes: 491_400_032,
  sha256: "74a4da8c9fdbcd15bd1f6d01d621410d31c6fc00986f5eb687824e7b93d7a9db",
  fileName: "qwen2.5-0.5b-instruct-q4_k_m.gguf",
} as const;

/** Search's own settings; each source reads its part of `env`. */
export interface SearchConfig {
  /** Deadline of a whole Search call. */
  requestTimeoutMs: number;
  /** Every TYPESAFE_SEARCH_* variable, read by the search sources' own parser. */
  env: Record<string, string>;
  /** Ids of the sources that are enabled and have what they need (for the start-up summary). */
  configuredSources?: string[];
  /** The lowest safe search a caller may ask for; an omitted `safe` takes it. */
  minSafe?: "off" | "moderate" | "strict";
}

export type { SettingRead } from "./setting-read.js";

/**
 * Parses `env` (process.env by default) into a Config, or throws a
 * ConfigError listing every problem. `onRead` hears of every variable read,
 * with its default: the settings tables of the docs are made from it.
 */
export function loadConfig(env: NodeJS.ProcessEnv = process.env, cwd = process.cwd(), onRead?: (setting: SettingRead) => void): Config {
  const problems: string[] = [];
  const int = (name: string, fallback: number, min = 0, max = Number.MAX_SAFE_INTEGER): number => {
    onRead?.({ name, default: String(fallback), range: [min, max] });
    const raw = env[name];
    if (raw === undefined || raw === "") return fallback;
    const value = Number(raw);
    if (!Number.isInteger(value) || value < min || value > max) {
      problems.push(`${name}: must be an integer between ${min} and ${max}, got "${raw}"`);
      return fallback;
    }
    return value;
  };
  function str(name: string): string | undefined;
  function str(name: string, fallback: string): string;
  function str(name: string, fallback?: string): string | undefined {
    onRead?.({ name, default: fallback });
    const raw = env[name]?.trim();
    return raw ? raw : fallback;
  }

  const logLevel = str("TYPESAFE_LOG_LEVEL", "info") as Config["logLevel"];
  if (!["debug", "info", "warn", "error", "silent"].includes(logLevel)) {
    problems.push(`TYPESAFE_LOG_LEVEL: must be one of debug, info, warn, error, silent, got "${logLevel}"`);
  }
  const metrics = str("TYPESAFE_METRICS", "on");
  if (metrics !== "on" && metrics !== "off") problems.push(`TYPESAFE_METRICS: must be on or off, got "${metrics}"`);
  const grpcShortPath = str("TYPESAFE_GRPC_SHORT_PATH", "on");
  if (grpcShortPath !== "on" && grpcShortPath !== "off") problems.push(`TYPESAFE_GRPC_SHORT_PATH: must be on or off, got "${grpcShortPath}"`);
  const llmBaseUrl = str("TYPESAFE_LLM_BASE_URL");
  if (llmBaseUrl && !/^https?:\/\/[^/]/.test(llmBaseUrl)) {
    problems.push(`TYPESAFE_LLM_BASE_URL: must be an http(s) URL, got "${llmBaseUrl}"`);
  }
  const embedded = str("TYPESAFE_LLM_EMBEDDED") ?? "on";
  if (embedded !== "on" && embedded !== "off") problems.push(`TYPESAFE_LLM_EMBEDDED: must be on or off, got "${embedded}"`);
  const modelPathRaw = str("TYPESAFE_LLM_MODEL_PATH");
  const modelPath = modelPathRaw === undefined ? undefined : path.resolve(cwd, modelPathRaw);
  // Checked only where it is used: an upstream URL or TYPESAFE_LLM_EMBEDDED=off leaves it unread.
  const modelFile = modelPath !== undefined && llmBaseUrl === undefined && embedded !== "off" ? modelFileProblem(modelPath) : undefined;
  if (modelFile) problems.push(`TYPESAFE_LLM_MODEL_PATH: ${modelFile}, got "${modelPathRaw}"`);
  const modelUrl = str("TYPESAFE_LLM_MODEL_URL");
  if (modelUrl && !/^https?:\/\/[^/]/.test(modelUrl)) problems.push(`TYPESAFE_LLM_MODEL_URL: must be an http(s) URL, got "${modelUrl}"`);
  const publicUrl = str("TYPESAFE_PUBLIC_URL");
  if (publicUrl !== undefined && publicUrlProblem(publicUrl)) {
    problems.push(`TYPESAFE_PUBLIC_URL: ${publicUrlProblem(publicUrl)}, got "${publicUrl}"`);
  }
  const allowLoopback = str("TYPESAFE_WEBHOOK_ALLOW_LOOPBACK") ?? "off";
  if (allowLoopback !== "on" && allowLoopback !== "off") problems.push(`TYPESAFE_WEBHOOK_ALLOW_LOOPBACK: must be on or off, got "${allowLoopback}"`);
  const retryDelaysRaw = str("TYPESAFE_WEBHOOK_RETRY_DELAYS_MS");
  const retryDelaysMs = retryDelaysRaw === undefined ? DEFAULT_WEBHOOK_RETRY_DELAYS_MS : retryDelaysRaw.split(",").map((d) => Number(d.trim()));
  if (retryDelaysMs.length === 0 || retryDelaysMs.length > 20 || retryDelaysMs.some((d) => !Number.isInteger(d) || d < 0)) {
    problems.push(`TYPESAFE_WEBHOOK_RETRY_DELAYS_MS: must be 1 to 20 comma-separated whole milliseconds, got "${retryDelaysRaw}"`);
  }
  const databaseUrl = str("DATABASE_URL");
  if (databaseUrl !== undefined) {
    const problem = databaseUrlProblem(databaseUrl);
    if (problem) problems.push(`DATABASE_URL: ${problem}`);
  }
  const searchEnv = Object.fromEntries(
    Object.entries(env).filter((e): e is [string, string] => e[0].startsWith("TYPESAFE_SEARCH_") && e[1] !== undefined),
  );
  const minSafe = str("TYPESAFE_SEARCH_MIN_SAFE", "off") as NonNullable<SearchConfig["minSafe"]>;
  if (!["off", "moderate", "strict"].includes(minSafe)) problems.push(`TYPESAFE_SEARCH_MIN_SAFE: must be one of off, moderate, strict, got "${minSafe}"`);
  // The search settings are checked here too, so every problem is listed before anything opens.
  let configuredSources: string[] = [];
  try {
    configuredSources = parseSourceCatalog(searchEnv, onRead).entries.filter((e) => e.configured).map((e) => e.id);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    problems.push(...err.problems);
  }

  const host = str("HOST", "127.0.0.1");
  const port = int("PORT", 8080, 0, 65535);
  const config: Config = {
    host,
    port,
    databaseUrl,
    dataDir: path.resolve(cwd, str("TYPESAFE_DATA_DIR", ".typesafe-data")),
    dbPoolMax: int("TYPESAFE_DB_POOL_MAX", 10, 2, 1000),
    logLevel,
    metrics: metrics !== "off",
    shutdownGraceMs: int("TYPESAFE_SHUTDOWN_GRACE_MS", 10_000),
    maxBodyBytes: 96 * 1024,
    connections: {
      headersTimeoutMs: int("TYPESAFE_HEADERS_TIMEOUT_MS", 10_000, 100, 600_000),
      bodyTimeoutMs: int("TYPESAFE_BODY_TIMEOUT_MS", 20_000, 100, 600_000),
      idleTimeoutMs: int("TYPESAFE_IDLE_TIMEOUT_MS", 75_000, 100, 3_600_000),
      lingerTimeMs: int("TYPESAFE_LINGER_TIME_MS", 30_000, 100, 600_000),
      maxConnections: int("TYPESAFE_MAX_CONNECTIONS", 4_096, 1, 1_000_000),
    },
    grpcShortPath: grpcShortPath !== "off",
    metering: {
      defaultFreeRequests: int("TYPESAFE_DEFAULT_FREE_REQUESTS", 0),
      leaseMarginMs: int("TYPESAFE_LEASE_MARGIN_MS", 30_000, 1_000),
      sweepIntervalMs: int("TYPESAFE_SWEEP_INTERVAL_MS", 5_000, 100),
      statementTimeoutMs: int("TYPESAFE_DB_STATEMENT_TIMEOUT_MS", 5_000, 100, 60_000),
      rollupIntervalMs: int("TYPESAFE_USAGE_ROLLUP_INTERVAL_MS", 60_000, 100, 3_600_000),
      rollupDelayMs: int("TYPESAFE_USAGE_ROLLUP_DELAY_MS", 300_000, 1_000, 86_400_000),
    },
    account: {
      publicUrl: (publicUrl && !publicUrlProblem(publicUrl) ? publicUrl : `http://${host.includes(":") ? `[${host}]` : host}:${port}`).replace(/\/+$/, ""),
      publicUrlConfigured: publicUrl !== undefined,
      passwordWork: {
        concurrent: int("TYPESAFE_PASSWORD_CHECKS_CONCURRENT", 2, 1, 64),
        queued: int("TYPESAFE_PASSWORD_CHECKS_QUEUED", 8, 0, 1_000),
        perClient: int("TYPESAFE_PASSWORD_CHECKS_PER_CLIENT", 2, 1, 1_000),
      },
      maxKeysPerAccount: int("TYPESAFE_MAX_KEYS_PER_ACCOUNT", 100, 1, 100_000),
      sessionIdleMs: int("TYPESAFE_SESSION_IDLE_MINUTES", 30, 1, 24 * 60) * 60_000,
      sessionAbsoluteMs: int("TYPESAFE_SESSION_ABSOLUTE_HOURS", 12, 1, 24 * 30) * 3_600_000,
    },
    llm: {
      baseUrl: llmBaseUrl?.replace(/\/+$/, ""),
      apiKey: str("TYPESAFE_LLM_API_KEY"),
      model: str("TYPESAFE_LLM_MODEL", "default"),
      requestTimeoutMs: int("TYPESAFE_LLM_REQUEST_TIMEOUT_MS", 60_000, 100),
      callTimeoutMs: int("TYPESAFE_LLM_CALL_TIMEOUT_MS", 20_000, 100),
      maxConcurrentCalls: int("TYPESAFE_LLM_MAX_CONCURRENT_CALLS", 64, 1),
      maxRetries: int("TYPESAFE_LLM_MAX_RETRIES", 2, 0, 10),
      embedded: {
        enabled: embedded !== "off",
        modelPath,
        modelUrl: modelUrl ?? DEFAULT_EMBEDDED_MODEL.url,
        modelBytes: DEFAULT_EMBEDDED_MODEL.bytes,
        modelSha256: DEFAULT_EMBEDDED_MODEL.sha256,
        modelFileName: DEFAULT_EMBEDDED_MODEL.fileName,
        contextTokens: int("TYPESAFE_LLM_CONTEXT_TOKENS", 8_192, 512, 131_072),
        sequences: int("TYPESAFE_LLM_SEQUENCES", 2, 1, 64),
        threads: int("TYPESAFE_LLM_THREADS", 0, 0, 256),
        maxWaitMs: int("TYPESAFE_LLM_EMBEDDED_MAX_WAIT_MS", 300_000, 1_000, 3_600_000),
      },
    },
    search: {
      requestTimeoutMs: int("TYPESAFE_SEARCH_REQUEST_TIMEOUT_MS", 10_000, 100),
      env: searchEnv,
      configuredSources,
      minSafe,
    },
    webhooks: {
      allowLoopback: allowLoopback === "on",
      timeoutMs: int("TYPESAFE_WEBHOOK_TIMEOUT_MS", 10_000, 100, 60_000),
      retryDelaysMs,
      pollIntervalMs: int("TYPESAFE_WEBHOOK_POLL_MS", 1_000, 10, 60_000),
      keyExpiryCheckMs: int("TYPESAFE_WEBHOOK_KEY_EXPIRY_CHECK_MS", 60_000, 10, 3_600_000),
      dnsServers: (str("TYPESAFE_WEBHOOK_DNS_SERVERS") ?? "").split(",").map((s) => s.trim()).filter((s) => s !== ""),
    },
    evaluations: {
      examplesInFlight: int("TYPESAFE_EVALUATION_EXAMPLES_IN_FLIGHT", 4, 0, 64),
      pollIntervalMs: int("TYPESAFE_EVALUATION_POLL_MS", 1_000, 10, 60_000),
    },
  };
  if (problems.length > 0) throw new ConfigError(problems);
  return config;
}

/**
 * Why a model file cannot be loaded, or undefined: it must exist, be a file
 * this process can read, and start with the GGUF magic. Found at start, not
 * minutes later when the background load fails.
 */
function modelFileProblem(file: string): string | undefined {
  let fd: number;
  try {
    fd = fs.openSync(file, "r");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    return code === "ENOENT" ? `no file at ${file}` : code === "EACCES" || code === "EPERM" ? `${file} cannot be read by this process (${code})` : `${file} cannot be opened (${code})`;
  }
  try {
    const magic = Buffer.alloc(4);
    const read = fs.readSync(fd, magic, 0, 4, 0);
    return read === 4 && magic.toString("latin1") === "GGUF" ? undefined : `${file} is not a GGUF model file (it does not start with "GGUF")`;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    return code === "EISDIR" ? `${file} is a folder, not a GGUF model file` : `${file} cannot be read (${code})`;
  } finally {
    fs.closeSync(fd);
  }
}

/** Why a TYPESAFE_PUBLIC_URL cannot be used (an http(s) origin, optionally with a path), or undefined. */
function publicUrlProblem(raw: string): string | undefined {
  try {
    const url = new URL(raw);
    if (url.protocol !== "http:" && url.protocol !== "https:") return "must be an http:// or https:// URL";
    if (url.search !== "" || url.hash !== "" || url.username !== "" || url.password !== "") return "must have no query, fragment or credentials";
    return undefined;
  } catch {
    return "must be an http:// or https:// URL";
  }
}

/** Why a DATABASE_URL cannot be used, without echoing it (it may hold a password); undefined when fine. */
function databaseUrlProblem(raw: string): string | undefined {
  const expected = "expected postgres://user:password@host:5432/database, or several nodes as postgres://user:password@host1:5432,host2:5432/database";
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(raw)?.[1];
  if (scheme === undefined) return `not a postgres:// URL; ${expected}`;
  if (!/^postgres(ql)?$/i.test(scheme)) return `not a postgres:// URL (its scheme is "${scheme}"); ${expected}`;
  let target;
  try {
    target = parseDatabaseUrl(raw);
  } catch (err) {
    if (err instanceof DatabaseUrlError) return err.message;
    throw err;
  }
  // A socket directory may stand in the query (?host=/var/run/postgresql) instead of the authority.
  if (/[?&]host=/.test(raw)) return undefined;
  const unusable = target.nodes.find((node) => {
    try {
      return new URL(node.url).hostname === "";
    } catch {
      return true;
    }
  });
  if (unusable === undefined) return undefined;
  // libpq reads an empty host as its default socket directory; the pg driver would try localhost instead, so say how to name the socket.
  return `names no host, or is not a valid URL; ${expected}, or for a Unix socket postgres://user@/database?host=/var/run/postgresql (the socket's directory)`;
}

/**
 * What each variable loadConfig reads means, for the people who set it: the
 * settings tables of docs/ are made from these lines and loadConfig's
 * defaults (`npm run docs:generate`), in this order, and a test fails when a
 * variable read here has no line or a line names a variable no longer read.
 */
export const SETTING_MEANINGS: Readonly<Record<string, string>> = {
  PORT: "the one port for every protocol",
  HOST: "listen address (`0.0.0.0` in a container)",
  DATABASE_URL:
    "PostgreSQL server (`postgres://user:password@host:5432/database`; a socket directory as `postgres://user@/database?host=/var/run/postgresql`); several nodes as `postgres://user:password@host1:5432,host2:5432/database` with `target_session_attrs` `read-write` (default) or `any` (docs/high-availability.md); without it the embedded store is used",
  TYPESAFE_DATA_DIR: "folder of the embedded store",
  TYPESAFE_DB_POOL_MAX: "connections per replica to `DATABASE_URL`, or to the embedded store's wire",
  TYPESAFE_LOG_LEVEL: "debug, info, warn, error, silent",
  TYPESAFE_METRICS: "`off` removes `GET /metrics` and the collection behind it",
  TYPESAFE_SHUTDOWN_GRACE_MS: "how long SIGTERM lets calls in flight finish",
  TYPESAFE_GRPC_SHORT_PATH: "`off` serves unary gRPC through Connect's own handler instead of the short path; for comparing the two",
  TYPESAFE_DEFAULT_FREE_REQUESTS: "free requests of an account created without `--free-requests`",
  TYPESAFE_LEASE_MARGIN_MS: "added to a call's deadline to form the lease of its hold",
  TYPESAFE_SWEEP_INTERVAL_MS: "how often each replica releases expired holds",
  TYPESAFE_USAGE_ROLLUP_INTERVAL_MS: "how often each replica counts closed hours of calls into the usage roll-up that usage summaries read",
  TYPESAFE_USAGE_ROLLUP_DELAY_MS:
    "how long after its end an hour of calls may be rolled up (an hour with a call still active waits for it); summaries stay exact, they only read more calls while it waits",
  TYPESAFE_DB_STATEMENT_TIMEOUT_MS: "client-side deadline of one metering statement; a reply lost past it is asked for again by request id",
  TYPESAFE_PUBLIC_URL:
    "where people reach the service (default `http://HOST:PORT`): the invite links the CLI prints, the account area's allowed origin and `Secure` cookies; the CLI reads it too, so give it the service's value",
  TYPESAFE_SESSION_IDLE_MINUTES: "an account-area session unused this long ends",
  TYPESAFE_SESSION_ABSOLUTE_HOURS: "an account-area session ends this long after sign-in",
  TYPESAFE_HEADERS_TIMEOUT_MS:
    "from accept until a whole HTTP/1.1 request head (or an HTTP/2 session's first stream) has arrived; a late head gets 408, a preface-only HTTP/2 session is destroyed",
  TYPESAFE_BODY_TIMEOUT_MS: "the longest pause between two reads of a request body; HTTP/1.1 closes the connection, HTTP/2 resets only that stream",
  TYPESAFE_IDLE_TIMEOUT_MS: "a connection with no request or stream in progress; HTTP/2 closes gracefully: GOAWAY, a ping, then the final GOAWAY",
  TYPESAFE_LINGER_TIME_MS:
    "how long an HTTP/1.1 body is still read and discarded after an answer that did not wait for it (401, 413, 415), before the connection closes lingering",
  TYPESAFE_MAX_CONNECTIONS: "open connections; one more is closed as soon as it is accepted, while open connections keep being served",
  TYPESAFE_PASSWORD_CHECKS_CONCURRENT: "password hashes (scrypt) computed at once; each takes about 128 MiB",
  TYPESAFE_PASSWORD_CHECKS_QUEUED: "password checks that may wait for a turn; one more is 429 `PASSWORD_CHECKS_BUSY`",
  TYPESAFE_PASSWORD_CHECKS_PER_CLIENT: "password checks one client address may have running or waiting",
  TYPESAFE_MAX_KEYS_PER_ACCOUNT: "live keys one account may have; one more is 409 `KEY_LIMIT_REACHED`",
  TYPESAFE_WEBHOOK_ALLOW_LOOPBACK: "`on` lets webhook endpoints be on loopback: local development only; every other private range stays refused",
  TYPESAFE_WEBHOOK_RETRY_DELAYS_MS: "comma-separated waits after each failed webhook attempt; by default the Standard Webhooks schedule (docs/webhooks.md)",
  TYPESAFE_WEBHOOK_TIMEOUT_MS: "one webhook attempt, from resolving the host to the answer; a 2xx within it is a delivery",
  TYPESAFE_WEBHOOK_POLL_MS: "how often each replica looks for webhook deliveries that are due",
  TYPESAFE_WEBHOOK_KEY_EXPIRY_CHECK_MS: "how often each replica records `key.expiring` for keys that expire within 7 days (each key once per expiry)",
  TYPESAFE_WEBHOOK_DNS_SERVERS: "DNS servers asked for webhook endpoint names (`host` or `host:port`, comma-separated); the system resolver when unset",
  TYPESAFE_EVALUATION_EXAMPLES_IN_FLIGHT: "evaluation examples this replica asks at once, over every evaluation (0: this replica runs none); the API's calls keep the rest of the upstream's slots ([evaluations.md](evaluations.md))",
  TYPESAFE_EVALUATION_POLL_MS: "how often each replica looks for evaluation examples to run when nothing woke it",
  TYPESAFE_LLM_BASE_URL: "for example `http://127.0.0.1:8000/v1`; wins over the embedded model; unset: the embedded model answers",
  TYPESAFE_LLM_API_KEY: "sent as `Authorization: Bearer` to the upstream only",
  TYPESAFE_LLM_MODEL: "the upstream's model name",
  TYPESAFE_LLM_REQUEST_TIMEOUT_MS: "deadline of one decision; questions still running become `timeout` errors",
  TYPESAFE_LLM_CALL_TIMEOUT_MS: "timeout of one upstream HTTP attempt",
  TYPESAFE_LLM_MAX_CONCURRENT_CALLS: "per-process cap on upstream calls in flight",
  TYPESAFE_LLM_MAX_RETRIES: "retries on 429, 5xx and network errors, within the deadline; not billed",
  TYPESAFE_LLM_EMBEDDED: "`off`: no embedded model; without an upstream, decisions answer 503 `NOT_CONFIGURED` (default on)",
  TYPESAFE_LLM_MODEL_PATH: "a local GGUF file for the embedded model; nothing is downloaded or pinned; a missing or unreadable file stops the start",
  TYPESAFE_LLM_MODEL_URL: "a mirror of the pinned model file (default: the pinned address); the pinned size and SHA-256 still apply",
  TYPESAFE_LLM_CONTEXT_TOKENS: "the longest prompt of one question on the embedded model, in tokens (sequences hold up to 2048; a longer prompt gets a cache of its own while it is answered)",
  TYPESAFE_LLM_SEQUENCES: "questions the embedded model evaluates side by side",
  TYPESAFE_LLM_THREADS: "CPU threads of llama.cpp; 0: the machine's physical cores (default); set fewer to leave cores to other work",
  TYPESAFE_LLM_EMBEDDED_MAX_WAIT_MS:
    "the longest a decision on the embedded model may run: its deadline grows past `TYPESAFE_LLM_REQUEST_TIMEOUT_MS` to what its tokens and those queued ahead need at the measured rate, up to this; a call estimated longer is refused at once with 503 `MODEL_BUSY`",
  TYPESAFE_SEARCH_SOURCES: "comma list of enabled ids, or `none` (keyed ones also need their key)",
  TYPESAFE_SEARCH_CONTACT: "e-mail or URL in the User-Agent (Wikimedia and GDELT ask for one)",
  TYPESAFE_SEARCH_REQUEST_TIMEOUT_MS: "deadline of one search",
  TYPESAFE_SEARCH_CACHE_ENTRIES: "cache size per process (0 = off)",
  TYPESAFE_SEARCH_MIN_SAFE: "lowest `safe` a search may ask (`off`, `moderate`, `strict`); an omitted `safe` takes it",
  "TYPESAFE_SEARCH_<ID>_KEY": "the provider's key (Brave, Exa; optional for Stack Exchange, GitHub)",
  "TYPESAFE_SEARCH_<ID>_URL": "base URL (mirror, proxy, tests)",
  "TYPESAFE_SEARCH_<ID>_PRICE_UNITS": "price per call in units (1 credit = 1,000,000)",
  "TYPESAFE_SEARCH_<ID>_DEFAULT": "`true`/`false`: queried when `s` is omitted",
  "TYPESAFE_SEARCH_<ID>_WEIGHT": "fusion weight, above 0 and at most 100",
  "TYPESAFE_SEARCH_<ID>_TIMEOUT_MS": "timeout of one call to the provider",
  "TYPESAFE_SEARCH_<ID>_RATE": "budget per process, `<count>/<n><s\\|m\\|h\\|d>` (for example `10/1m`)",
  "TYPESAFE_SEARCH_<ID>_CONCURRENCY": "calls in flight per process",
};
