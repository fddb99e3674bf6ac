import { domainToASCII } from "node:url";
import { parse as parseHost } from "tldts";

/**
 * Domain entries of the `d` and `xd` lists: what a caller may write, and
 * which result hosts an entry covers. An entry is a host name; it covers
 * itself and every subdomain ("example.com" covers "docs.example.com"), or,
 * written "*.example.com", the subdomains only. Public suffixes come from the
 * Public Suffix List (tldts, ICANN section): "com" or "co.uk" name no site, so
 * they are refused, while a private suffix such as "github.io" is a site a
 * caller may well want to keep or drop whole.
 */

/** A checked entry: the host in ASCII (punycode) and whether it covers only subdomains. */
export interface DomainRule {
  /** As the caller wrote it (trimmed), for messages. */
  entry: string;
  /** Lower case ASCII host, without the "*." prefix. */
  host: string;
  subdomainsOnly: boolean;
}

/** Why an entry is refused, in words for the 400; undefined when it is a host name we can match. */
export function domainEntryProblem(entry: string): string | undefined {
  if (entry.trim() === "") return "must be a domain name, not empty";
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(entry)) return "must be a domain name, not a URL (no scheme)";
  if (entry.includes("/")) return "must be a domain name without a path";
  if (entry.includes("@")) return "must be a domain name, not an address with a user";
  if (/:\d*$/.test(entry) && !entry.includes("[")) return "must be a domain name without a port";
  if (entry.includes("*") && !/^\*\.[^*]+$/.test(entry)) return 'may hold a wildcard only as a leading "*." (as in "*.example.com")';
  const rule = readDomain(entry);
  if (rule === undefined) return "is not a valid domain name";
  const parsed = parseHost(rule.host, { allowPrivateDomains: false });
  if (parsed.isIp) return "must be a domain name, not an IP address";
  if (parsed.domain === null) {
    return `is a public suffix (${JSON.stringify(parsed.publicSuffix ?? rule.host)}), which names no site: give a domain under it`;
  }
  return undefined;
}

/** The entry as a rule, or undefined when it is not a well-formed host name. */
export function readDomain(entry: string): DomainRule | undefined {
  const trimmed = entry.trim();
  const subdomainsOnly = trimmed.startsWith("*.");
  const name = subdomainsOnly ? trimmed.slice(2) : trimmed;
  if (name.endsWith(".") || name.startsWith(".")) return undefined;
  const host = domainToASCII(name.toLowerCase());
  if (host === "" || host.length > 253) return undefined;
  const labels = host.split(".");
  if (!labels.every((label) => /^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$/.test(label))) return undefined;
  return { entry: trimmed, host, subdomainsOnly };
}

/**
 * True when a result host (lower case ASCII, as hostOfUrl gives it) is the
 * rule's domain or under it, dot-aligned: "notexample.com" is not under "example.com".
 */
export function hostCovered(host: string, rule: DomainRule): boolean {
  if (host.length === rule.host.length) return host === rule.host && !rule.subdomainsOnly;
  return host.length > rule.host.length && host.charCodeAt(host.length - rule.host.length - 1) === 46 /* "." */ && host.endsWith(rule.host);
}

/** The host of a URL as the WHATWG parser gives it (ASCII, lower case), without a final dot; "" when unreadable. */
export function hostOfUrl(url: string): string {
  try {
    const host = new URL(url).hostname;
    return host.endsWith(".") ? host.slice(0, -1) : host;
  } catch {
    return "";
  }
}

/** True when rule `inner` covers nothing that `outer` does not (so an included `inner` is all excluded by `outer`). */
export function ruleWithin(inner: DomainRule, outer: DomainRule): boolean {
  if (inner.host === outer.host) return !outer.subdomainsOnly || inner.subdomainsOnly;
  return inner.host.endsWith(`.${outer.host}`);
}
