import net from "node:net";
import type { Violation } from "../validation.js";
import { refusalOf } from "./address-check.js";

/** Longer URLs are refused: no receiver needs one, and they fill the page and the log. */
export const MAX_URL_LENGTH = 2048;

/**
 * Why an endpoint URL cannot be used, as violations of `field`: an absolute
 * http(s) URL, with no credentials or fragment, whose host, when written as an
 * address, may receive webhooks. Names are checked again at each delivery,
 * after they are resolved.
 */
export function endpointUrlViolations(field: string, raw: string, allowLoopback: boolean): Violation[] {
  if (raw.length === 0) return [{ field, rule: "must not be empty" }];
  if (raw.length > MAX_URL_LENGTH) return [{ field, rule: `must be at most ${MAX_URL_LENGTH} characters` }];
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return [{ field, rule: "must be an absolute http:// or https:// URL" }];
  }
  if (url.protocol !== "https:" && url.protocol !== "http:") return [{ field, rule: "must be an http:// or https:// URL" }];
  if (url.username !== "" || url.password !== "") return [{ field, rule: "must not hold credentials" }];
  if (url.hash !== "") return [{ field, rule: "must not have a fragment" }];
  const host = hostOf(url);
  if (net.isIP(host) !== 0) {
    const refusal = refusalOf(host, allowLoopback);
    if (refusal) return [{ field, rule: `must reach a public address (${refusal})` }];
  } else if (host === "localhost" || host.endsWith(".localhost")) {
    if (!allowLoopback) return [{ field, rule: "must reach a public address (localhost is loopback)" }];
  }
  return [];
}

/** The URL's host without IPv6 brackets. */
export function hostOf(url: URL): string {
  return url.hostname.replace(/^\[(.*)\]$/, "$1");
}
