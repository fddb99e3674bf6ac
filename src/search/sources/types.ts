import type { Logger } from "../../logger.js";
import type { SearchWindow, SourceId } from "../validate.js";

/**
 * The contract between the engine and one provider adapter. Adapters only
 * speak their provider's protocol and map its fields; timeouts, rate limits,
 * caching, normalization and fusion live in the engine, so every adapter stays
 * a small, separately testable client.
 */
export interface SearchSource {
  readonly id: SourceId;
  /**
   * Optional local check before any rate token is spent: the query as this
   * provider can take it, or a fixed reason why it cannot (then no call is made).
   */
  prepare?(query: string): { query: string } | { skip: string };
  /** Bumped when the mapping changes, so cached answers of the old mapping are not served. */
  readonly version: number;
  /** One upstream call. Resolves with the provider's items in its own order; throws SourceFailure. */
  search(call: SourceCall): Promise<SourceAnswer>;
}

export interface SourceCall {
  /** Trimmed, NFC, whitespace collapsed. */
  query: string;
  window: SearchWindow;
  /** Request time T (ms since epoch) from the injected clock; windows are computed from it. */
  nowMs: number;
  /** Fires on the source's timeout, the overall deadline or the caller's cancellation. */
  signal: AbortSignal;
}

/** One item as the provider gave it; normalize() in merge.ts cleans and validates it. */
export interface RawItem {
  title: string;
  url: string;
  snippet: string;
  /** Anything Date can parse, or null when the provider gave no date. */
  publishedAt: string | null;
  /** A second link: the discussion of an article whose own URL is `url` (Hacker News). */
  discussionUrl?: string | undefined;
  /**
   * True when the snippet is made up by us from facts (points, score, tags)
   * rather than written by the provider: fusion prefers a real description.
   */
  generatedSnippet?: boolean;
  /** Paper identifiers, used as dedupe keys ahead of the URL. */
  doi?: string | undefined;
  arxivId?: string | undefined;
}

export interface SourceAnswer {
  items: RawItem[];
  /** Fixed text shown as the report's reason on an ok answer (e.g. incomplete upstream results). */
  note?: string;
  /** The upstream asked us to pause (Stack Exchange `backoff`, an exhausted daily quota). */
  pauseMs?: number;
}

/**
 * Who must act: `rate_limited` — the provider asked us to wait; `auth` and
 * `quota` — the operator's key, User-Agent or plan (reported as not_configured
 * with the reason, logged once); `error` — anything else, with upstreamFault
 * false when the caller's query caused it (nothing is suspended then).
 */
export type FailureKind = "rate_limited" | "auth" | "quota" | "error";

/**
 * A classified upstream failure. `reason` is fixed text written by us: upstream
 * bodies, headers and keys never travel in it, because it reaches callers.
 */
export class SourceFailure extends Error {
  constructor(
    readonly kind: FailureKind,
    readonly reason: string,
    readonly opts: {
      /** How long the upstream asked us to stay away (Retry-After, backoff, rate reset). */
      retryAfterMs?: number | undefined;
      /**
       * False when this query caused the failure (GDELT's "phrase too short",
       * an arXiv error feed): such failures must not suspend the source for everyone.
       */
      upstreamFault?: boolean;
      cause?: unknown;
    } = {},
  ) {
    super(reason, { cause: opts.cause });
    this.name = "SourceFailure";
  }

  get upstreamFault(): boolean {
    return this.opts.upstreamFault ?? true;
  }
}

/** What every adapter factory receives; parsed by source-config.ts. */
export interface SourceSettings {
  /** Scheme, host and optional path prefix, without a trailing slash. */
  baseUrl: string;
  key: string | undefined;
  userAgent: string;
  logger: Logger;
}

/**
 * GET/POST with the identifying User-Agent every provider asks for, and the
 * status classes that mean the same thing everywhere (429, 401/403, 5xx).
 * Adapters handle provider-specific statuses before calling failForStatus.
 */
export async function callUpstream(
  settings: SourceSettings,
  url: URL,
  call: SourceCall,
  init: { method?: "GET" | "POST"; headers?: Record<string, string>; body?: string } = {},
): Promise<Response> {
  try {
    return await fetch(url, {
      method: init.method ?? "GET",
      headers: { "User-Agent": settings.userAgent, ...init.headers },
      body: init.body,
      signal: call.signal,
      // A key must never follow a redirect to another host; keyless calls may (e.g. http → https).
      redirect: settings.key === undefined ? "follow" : "error",
    });
  } catch (err) {
    if (call.signal.aborted) throw err;
    throw new SourceFailure("error", "upstream unreachable", { cause: err });
  }
}

/** Throws the generic classification of a non-2xx answer; returns when the status is 2xx. */
export function failForStatus(res: Response, nowMs: number): void {
  if (res.ok) return;
  if (res.status === 429) {
    throw new SourceFailure("rate_limited", "upstream rate limit reached", {
      retryAfterMs: retryAfterMs(res.headers, nowMs),
    });
  }
  if (res.status === 401 || res.status === 403) {
    throw new SourceFailure("auth", "upstream refused our credentials");
  }
  throw new SourceFailure("error", `upstream answered HTTP ${res.status}`);
}

/** Retry-After as delta seconds or an HTTP date, at most MAX_PAUSE_MS; undefined when absent or unreadable. */
export function retryAfterMs(headers: Headers, nowMs: number): number | undefined {
  const raw = headers.get("retry-after")?.trim();
  if (!raw) return undefined;
  if (/^\d+$/.test(raw)) return clampPauseMs(Number(raw) * 1000);
  const at = Date.parse(raw);
  return Number.isNaN(at) ? undefined : clampPauseMs(at - nowMs);
}

/**
 * Longest pause an upstream can impose on a source (a day covers Stack
 * Exchange's daily quota). An absurd Retry-After or backoff must not suspend
 * a source for ever.
 */
export const MAX_PAUSE_MS = 24 * 3600_000;

/** A requested pause within 0..MAX_PAUSE_MS. */
export function clampPauseMs(ms: number): number {
  return Number.isNaN(ms) ? MAX_PAUSE_MS : Math.min(MAX_PAUSE_MS, Math.max(0, ms));
}

/** Largest answer read from a provider; ten results never come near it. */
export const MAX_ANSWER_BYTES = 4 * 1024 * 1024;

/** Reads a body as UTF-8 text, refusing answers above MAX_ANSWER_BYTES without buffering them. */
export async function readText(res: Response, maxBytes = MAX_ANSWER_BYTES): Promise<string> {
  if (Number(res.headers.get("content-length") ?? 0) > maxBytes) {
    await res.body?.cancel();
    throw new SourceFailure("error", "upstream answer too large");
  }
  if (!res.body) return "";
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > maxBytes) {
      await reader.cancel();
      throw new SourceFailure("error", "upstream answer too large");
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks).toString("utf8");
}

/** Reads a JSON body; anything else (GDELT's text/html error page, truncated JSON) is an error. */
export async function readJson(res: Response): Promise<unknown> {
  const type = res.headers.get("content-type") ?? "";
  const text = await readText(res);
  if (!/json/i.test(type) && !/^\s*[[{]/.test(text)) {
    throw new SourceFailure("error", "upstream sent a non-JSON answer");
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (err) {
    throw new SourceFailure("error", "upstream sent unreadable JSON", { cause: err });
  }
}

/** Narrowing helpers: provider JSON is untrusted, so every field is read defensively. */
export function asRecord(value: unknown): Record<string, unknown> | undefined {
  return typeof value === "object" && value !== null && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined;
}
export function asArray(value: unknown): unknown[] {
  return Array.isArray(value) ? value : [];
}
export function asString(value: unknown): string {
  return typeof value === "string" ? value : "";
}
export function asNumber(value: unknown): number | undefined {
  return typeof value === "number" && Number.isFinite(value) ? value : undefined;
}

/**
 * Unix seconds from a provider as ISO-8601, or null when they are not a
 * time Date can represent (e.g. 1e20): one odd item must not fail the answer.
 */
export function isoFromUnixSeconds(value: unknown): string | null {
  const seconds = asNumber(value);
  if (seconds === undefined) return null;
  const date = new Date(seconds * 1000);
  return Number.isNaN(date.getTime()) ? null : date.toISOString();
}

/** Fixed reason for an answer whose top-level shape is not the provider's documented one. */
export const UNEXPECTED_SHAPE = "upstream answer has an unexpected shape";

/**
 * Guards for the top-level shape of an answer. A wrong shape (`"hits": null`,
 * a missing list) means we cannot tell "no results" from "something else
 * answered", so it is an error, never an empty (and charged) answer.
 */
export function requireRecord(value: unknown): Record<string, unknown> {
  const record = asRecord(value);
  if (!record) throw new SourceFailure("error", UNEXPECTED_SHAPE);
  return record;
}
export function requireArray(value: unknown): unknown[] {
  if (!Array.isArray(value)) throw new SourceFailure("error", UNEXPECTED_SHAPE);
  return value;
}
/** A list the provider omits when it has nothing to say (Brave's `web`, GDELT's `articles`); present, it must be a list. */
export function optionalArray(value: unknown): unknown[] {
  return value === undefined ? [] : requireArray(value);
}
/** An object the provider omits when it has nothing to say; present, it must be an object. */
export function optionalRecord(value: unknown): Record<string, unknown> {
  return value === undefined ? {} : requireRecord(value);
}

/** The cutoff of a window relative to T; undefined for "any". */
export function windowCutoffMs(window: SearchWindow, nowMs: number): number | undefined {
  switch (window) {
    case "any":
      return undefined;
    case "24h":
      return nowMs - 24 * 3600_000;
    case "7d":
      return nowMs - 7 * 24 * 3600_000;
    case "30d":
      return nowMs - 30 * 24 * 3600_000;
  }
}

/** Joins a base URL (which may carry a path prefix, e.g. a proxy) with an API path. */
export function endpoint(baseUrl: string, path: string): URL {
  return new URL(baseUrl + path);
}
