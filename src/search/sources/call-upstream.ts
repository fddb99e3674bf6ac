import { retryAfterMs } from "./retry-after.js";
import { SourceFailure } from "./source-failure.js";
import type { SourceCall, SourceSettings } from "./types.js";

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

/** Joins a base URL (which may carry a path prefix, e.g. a proxy) with an API path. */
export function endpoint(baseUrl: string, path: string): URL {
  return new URL(baseUrl + path);
}
