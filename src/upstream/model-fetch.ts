import crypto from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import https from "node:https";
import path from "node:path";
import type { Logger } from "../logger.js";

/**
 * Brings a model file into the data folder: from a revision-pinned address,
 * resumed with an HTTP Range request after an interruption, and verified
 * against the pinned size and SHA-256 before it takes its final name. A file
 * that does not match is moved aside and never loaded.
 */

export interface ModelSource {
  url: string;
  bytes: number;
  /** Lowercase hex. */
  sha256: string;
}

export interface FetchProgress {
  receivedBytes: number;
  totalBytes: number;
  bytesPerSecond: number;
  secondsLeft: number;
}

/** `cut`: the connection ended mid-file (resumed at once); `network`: no connection; `http`: an error status; `mismatch`: the wrong file; `disk`: the data folder refused the file. */
export type ModelFetchFailure = "cut" | "network" | "http" | "mismatch" | "disk";

export class ModelFetchError extends Error {
  constructor(
    message: string,
    readonly kind: ModelFetchFailure,
    /** How long the server asked to wait before the next try (Retry-After, or the Hub's RateLimit reset), when it said. */
    readonly waitHintMs?: number,
  ) {
    super(message);
    this.name = "ModelFetchError";
  }
}

/** A connection silent this long (no connect, no bytes) counts as lost: offline often means dropped packets, not a refusal. */
const IDLE_TIMEOUT_MS = 30_000;
/** How often a progress line is written at most. */
const PROGRESS_INTERVAL_MS = 5_000;
/** Connection attempts after a cut, each resuming where the file ends. */
const RESUME_ATTEMPTS = 3;

/**
 * The verified file at `target`: an existing one whose size and SHA-256 match,
 * or one fetched now (into `target.part`, resumed across cuts). Throws a
 * ModelFetchError saying what failed.
 */
export async function ensureModelFile(
  target: string,
  source: ModelSource,
  options: { logger: Logger; signal: AbortSignal; progressIntervalMs?: number },
): Promise<string> {
  const { logger } = options;
  if (fs.existsSync(target)) {
    await verify(target, source);
    return target;
  }
  fs.mkdirSync(path.dirname(target), { recursive: true });
  const part = `${target}.part`;
  let attempt = 0;
  for (;;) {
    try {
      await download(part, source, options);
      break;
    } catch (err) {
      if (!(err instanceof ModelFetchError) || err.kind !== "cut" || options.signal.aborted || ++attempt >= RESUME_ATTEMPTS) throw err;
      logger.warn("model download interrupted; resuming", { reason: err.message, received_bytes: sizeOf(part), attempt });
    }
  }
  try {
    await verify(part, source);
  } catch (err) {
    fs.renameSync(part, `${target}.rejected`);
    throw err;
  }
  fs.renameSync(part, target);
  return target;
}

/** Size first (cheap), then the SHA-256 of the whole file. */
export async function verify(file: string, source: ModelSource): Promise<void> {
  const size = sizeOf(file);
  if (size !== source.bytes) throw new ModelFetchError(`model file ${file} is ${size} bytes, expected ${source.bytes}`, "mismatch");
  const hash = crypto.createHash("sha256");
  for await (const chunk of fs.createReadStream(file)) hash.update(chunk as Buffer);
  const digest = hash.digest("hex");
  if (digest !== source.sha256) throw new ModelFetchError(`model file ${file} has SHA-256 ${digest}, expected ${source.sha256}`, "mismatch");
}

function sizeOf(file: string): number {
  try {
    return fs.statSync(file).size;
  } catch {
    return 0;
  }
}

async function download(part: string, source: ModelSource, options: { logger: Logger; signal: AbortSignal; progressIntervalMs?: number }): Promise<void> {
  const { logger, signal } = options;
  let have = sizeOf(part);
  if (have > source.bytes) {
    fs.rmSync(part);
    have = 0;
  }
  if (have === source.bytes) return;
  const response = await get(source.url, have > 0 ? { range: `bytes=${have}-` } : {}, signal);
  const status = response.statusCode ?? 0;
  if (status === 200 && have > 0) {
    // The server ignored the range: start over.
    have = 0;
  } else if (status !== 200 && status !== 206) {
    response.resume();
    throw new ModelFetchError(`model download from ${redacted(source.url)} answered HTTP ${status}`, "http", waitHintMs(response.headers, Date.now()));
  }
  const out = fs.createWriteStream(part, { flags: have > 0 ? "a" : "w" });
  let writeError: Error | undefined;
  out.on("error", (err) => {
    writeError = err;
    response.destroy(err);
  });
  const started = Date.now();
  const startedAt = have;
  let received = have;
  let lastLine = 0;
  const interval = options.progressIntervalMs ?? PROGRESS_INTERVAL_MS;
  logger.info("model download", { url: redacted(source.url), total_mb: round1(source.bytes / 1e6), resumed_at_mb: round1(have / 1e6) });
  try {
    for await (const chunk of response) {
      const buffer = chunk as Buffer;
      received += buffer.length;
      if (received > source.bytes) throw new ModelFetchError(`model download from ${redacted(source.url)} is longer than ${source.bytes} bytes`, "mismatch");
      if (!out.write(buffer)) await new Promise<void>((resolve) => out.once("drain", () => resolve()));
      const now = Date.now();
      if (now - lastLine >= interval || received === source.bytes) {
        lastLine = now;
        const p = progress(received, source.bytes, startedAt, started, now);
        logger.info("model download progress", {
          percent: round1((100 * received) / source.bytes),
          mb_per_s: round1(p.bytesPerSecond / 1e6),
          seconds_left: Math.round(p.secondsLeft),
        });
      }
    }
  } catch (err) {
    if (err instanceof ModelFetchError) throw err;
    if (writeError) throw new ModelFetchError(`model file ${part} could not be written: ${(writeError as NodeJS.ErrnoException).code ?? writeError.message}`, "disk");
    throw new ModelFetchError(`model download from ${redacted(source.url)} was cut at ${received} of ${source.bytes} bytes`, "cut");
  } finally {
    if (!out.destroyed) await new Promise<void>((resolve) => out.end(resolve));
  }
  if (received < source.bytes) throw new ModelFetchError(`model download from ${redacted(source.url)} was cut at ${received} of ${source.bytes} bytes`, "cut");
}

/**
 * The wait a refusal asks for: `Retry-After` in seconds or as a date (RFC
 * 9110 §10.2.3), else the reset of a `RateLimit` field (`"resolvers";r=0;t=55`,
 * draft-ietf-httpapi-ratelimit-headers-09), which the Hugging Face Hub sends
 * with its 429s.
 */
export function waitHintMs(headers: http.IncomingHttpHeaders, nowMs: number): number | undefined {
  const retryAfter = headers["retry-after"]?.trim();
  if (retryAfter) {
    if (/^\d+$/.test(retryAfter)) return Number(retryAfter) * 1000;
    const at = Date.parse(retryAfter);
    if (Number.isFinite(at)) return Math.max(0, at - nowMs);
  }
  const reset = /(?:^|;)\s*t=(\d+)/.exec(String(headers["ratelimit"] ?? ""))?.[1];
  return reset === undefined ? undefined : Number(reset) * 1000;
}

function progress(received: number, total: number, startedAt: number, started: number, now: number): FetchProgress {
  const seconds = Math.max((now - started) / 1000, 0.001);
  const bytesPerSecond = (received - startedAt) / seconds;
  return { receivedBytes: received, totalBytes: total, bytesPerSecond, secondsLeft: bytesPerSecond > 0 ? (total - received) / bytesPerSecond : Infinity };
}

function round1(x: number): number {
  return Math.round(x * 10) / 10;
}

/** The address without its query (a mirror may sign it). */
function redacted(url: string): string {
  return url.split("?", 1)[0]!;
}

/** A GET that follows redirects (the hub answers with a redirect to its file store). */
function get(url: string, headers: Record<string, string>, signal: AbortSignal, redirects = 5): Promise<http.IncomingMessage> {
  return new Promise((resolve, reject) => {
    const client = url.startsWith("https:") ? https : http;
    const request = client.get(url, { headers, signal }, (response) => {
      const location = response.headers.location;
      if (location && [301, 302, 303, 307, 308].includes(response.statusCode ?? 0)) {
        response.resume();
        if (redirects === 0) return reject(new ModelFetchError(`model download from ${redacted(url)}: too many redirects`, "http"));
        return resolve(get(new URL(location, url).toString(), headers, signal, redirects - 1));
      }
      resolve(response);
    });
    request.setTimeout(IDLE_TIMEOUT_MS, () => request.destroy(Object.assign(new Error("no answer"), { code: "ETIMEDOUT" })));
    request.on("error", (err) => reject(new ModelFetchError(`model download from ${redacted(url)} failed: ${(err as NodeJS.ErrnoException).code ?? err.message}`, "network")));
  });
}
