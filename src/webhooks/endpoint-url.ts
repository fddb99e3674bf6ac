import type { Violation } from "../validation.js";
import { hostRefusal } from "./address-check.js";

/** Longer URLs are refused: no receiver needs one, and they fill the page and the log. */
export const MAX_URL_LENGTH = 2048;

/**
 * Why an endpoint URL cannot be used, as violations of `field`: an absolute
 * http(s) URL, with no credentials or fragment, whose host, when written as an
 * address or a loopback name, may receive webhooks (hostRefusal, which each
 * delivery applies too). Other names are checked at each delivery, once resolved.
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
  const refusal = hostRefusal(hostOf(url), allowLoopback);
  return refusal ? [{ field, rule: `must reach a public address (${refusal})` }] : [];
}

/** The URL's host without IPv6 brackets. */
export function hostOf(url: URL): string {
  return url.hostname.replace(/^\[(.*)\]$/, "$1");
}
