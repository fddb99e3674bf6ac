import type { MessageInitShape } from "@bufbuild/protobuf";
import type { SearchRequest, SourceFiltersSchema } from "../gen/typesafe/search/v1/search_service_pb.js";
import type { Violation } from "../validation.js";
import { isCountryCode, isLanguageCode } from "./codes.js";
import { domainEntryProblem, hostCovered, hostOfUrl, readDomain, ruleWithin, type DomainRule } from "./domains.js";

/**
 * The search filters: domains to keep (`d`) and drop (`xd`), language (`l`),
 * country (`c`) and safe search (`safe`). Each source applies what its
 * provider can take natively; typesafe then checks every result itself where
 * it can. Domains are always checked on the result's own host, whatever the
 * provider did, so no result from an excluded domain, and none outside an
 * include list, ever reaches the caller. Language and country are checked
 * where the source states them per result; where nothing can be checked the
 * results are kept and the report says `unsupported`.
 */

export const FILTER_FIELDS = ["d", "xd", "l", "c", "safe"] as const;
export type FilterField = (typeof FILTER_FIELDS)[number];
export type Handling = "native" | "post_filtered" | "unsupported";
export const SAFE_LEVELS = ["off", "moderate", "strict"] as const;
export type SafeLevel = (typeof SAFE_LEVELS)[number];
export const MAX_DOMAINS = 20;

export interface SearchFilters {
  include: DomainRule[];
  exclude: DomainRule[];
  /** ISO 639-1. */
  language?: string;
  /** ISO 3166-1 alpha-2. */
  country?: string;
  safe?: SafeLevel;
}

export const NO_FILTERS: SearchFilters = { include: [], exclude: [] };

/** The filters asked, in contract order. */
export function filtersAsked(filters: SearchFilters): FilterField[] {
  const asked: FilterField[] = [];
  if (filters.include.length > 0) asked.push("d");
  if (filters.exclude.length > 0) asked.push("xd");
  if (filters.language !== undefined) asked.push("l");
  if (filters.country !== undefined) asked.push("c");
  if (filters.safe !== undefined) asked.push("safe");
  return asked;
}

/** Part of the cache key: the same filters in any order give the same text; no filters give "". */
export function filtersKey(filters: SearchFilters): string {
  if (filtersAsked(filters).length === 0) return "";
  const rules = (list: DomainRule[]) => list.map((r) => (r.subdomainsOnly ? "*." : "") + r.host).sort();
  return JSON.stringify([rules(filters.include), rules(filters.exclude), filters.language ?? "", filters.country ?? "", filters.safe ?? ""]);
}

/**
 * The request rules of the filters, checked on the decoded message (so on
 * every surface) before any money moves. `minSafe` is the operator's floor.
 */
export function validateFilters(request: Pick<SearchRequest, "d" | "xd" | "l" | "c" | "safe">, minSafe: SafeLevel = "off"): Violation[] {
  const violations: Violation[] = [];
  const include = checkDomainList("d", request.d, violations);
  const exclude = checkDomainList("xd", request.xd, violations);
  for (const [i, rule] of include) {
    const same = exclude.find(([, x]) => x.host === rule.host && x.subdomainsOnly === rule.subdomainsOnly);
    if (same) {
      violations.push({ field: `xd[${same[0]}]`, rule: `${JSON.stringify(same[1].entry)} is also in d; a domain cannot be both kept and dropped` });
      continue;
    }
    const outer = exclude.find(([, x]) => ruleWithin(rule, x));
    if (outer) {
      violations.push({ field: `d[${i}]`, rule: `${JSON.stringify(rule.entry)} lies inside ${JSON.stringify(outer[1].entry)} of xd, so nothing it keeps could be returned` });
    }
  }
  if (request.l !== "" && !isLanguageCode(request.l)) {
    violations.push({ field: "l", rule: `must be an ISO 639-1 language code in lower case, such as "en", got ${JSON.stringify(request.l)}` });
  }
  if (request.c !== "" && !isCountryCode(request.c)) {
    violations.push({ field: "c", rule: `must be an ISO 3166-1 alpha-2 country code in upper case, such as "DE", got ${JSON.stringify(request.c)}` });
  }
  if (request.safe !== "") {
    if (!(SAFE_LEVELS as readonly string[]).includes(request.safe)) {
      violations.push({ field: "safe", rule: `must be one of ${SAFE_LEVELS.join(", ")}` });
    } else if (SAFE_LEVELS.indexOf(request.safe as SafeLevel) < SAFE_LEVELS.indexOf(minSafe)) {
      violations.push({ field: "safe", rule: `must be at least "${minSafe}" on this deployment` });
    }
  }
  return violations;
}

function checkDomainList(field: "d" | "xd", entries: string[], violations: Violation[]): [number, DomainRule][] {
  if (entries.length > MAX_DOMAINS) {
    violations.push({ field, rule: `must list at most ${MAX_DOMAINS} domains, got ${entries.length}` });
  }
  const rules: [number, DomainRule][] = [];
  entries.forEach((entry, i) => {
    const problem = domainEntryProblem(entry);
    if (problem !== undefined) {
      violations.push({ field: `${field}[${i}]`, rule: `${JSON.stringify(entry)} ${problem}` });
      return;
    }
    const rule = readDomain(entry)!;
    if (rules.some(([, r]) => r.host === rule.host && r.subdomainsOnly === rule.subdomainsOnly)) {
      violations.push({ field: `${field}[${i}]`, rule: `${JSON.stringify(entry)} is listed twice` });
      return;
    }
    rules.push([i, rule]);
  });
  return rules;
}

/** The filters of a valid request; an omitted `safe` takes the operator's floor when that is above "off". */
export function readFilters(request: Pick<SearchRequest, "d" | "xd" | "l" | "c" | "safe">, minSafe: SafeLevel = "off"): SearchFilters {
  const safe = request.safe !== "" ? (request.safe as SafeLevel) : minSafe !== "off" ? minSafe : undefined;
  return {
    include: request.d.map((entry) => readDomain(entry)!),
    exclude: request.xd.map((entry) => readDomain(entry)!),
    ...(request.l !== "" ? { language: request.l } : {}),
    ...(request.c !== "" ? { country: request.c } : {}),
    ...(safe !== undefined ? { safe } : {}),
  };
}

/** True when a result on this host may reach the caller: under no excluded domain, and under an included one when there are. */
export function hostAllowed(host: string, filters: SearchFilters): boolean {
  if (host === "") return false;
  if (filters.exclude.some((rule) => hostCovered(host, rule))) return false;
  return filters.include.length === 0 || filters.include.some((rule) => hostCovered(host, rule));
}

/** How a source applies each asked filter, and whether it can serve the request at all. */
export interface FilterPlan {
  applied: Partial<Record<FilterField, Handling>>;
  /** The filters leave nothing this source could return: it is reported filtered_out and not called. */
  cannotServe?: { field: FilterField; reason: string };
  /**
   * Results to ask the provider for, above the usual page when typesafe's
   * check may drop some: within the provider's documented maximum, and only
   * where a larger page costs the same.
   */
  fetchCount?: number;
}

/** Results one source contributes to a fusion (its page): also what a larger fetch is trimmed back to. */
export const PAGE_SIZE = 10;

/**
 * A source's plan completed: every asked filter gets a handling. Domains
 * default to typesafe's own check (always possible: every result has a
 * host); the others to unsupported.
 */
export function completePlan(filters: SearchFilters, given: FilterPlan | undefined): FilterPlan {
  if (filtersAsked(filters).length === 0) return { applied: {} };
  const applied: Partial<Record<FilterField, Handling>> = {};
  for (const field of filtersAsked(filters)) {
    applied[field] = given?.applied[field] ?? (field === "d" || field === "xd" ? "post_filtered" : "unsupported");
  }
  return { ...given, applied };
}

/** What the check reads of a result: its links and what the source states of it. */
export interface FilterableItem {
  url: string;
  discussionUrl?: string | undefined;
  language?: string | undefined;
  country?: string | undefined;
}

export interface FilterOutcome<T> {
  kept: T[];
  dropped: Partial<Record<FilterField, number>>;
}

/**
 * typesafe's own check of one source's results. Domains always, on the
 * result URL's host (a discussion link on a host the filters refuse is
 * removed from the result). Language and country where the source states
 * them: a result stating another value is dropped; one stating none is
 * dropped only when typesafe alone filters (`post_filtered`), since the
 * provider already filtered a `native` one. Each drop counts once, for the
 * first filter it fails, in contract order.
 */
export function applyFilters<T extends FilterableItem>(items: T[], filters: SearchFilters, plan: FilterPlan): FilterOutcome<T> {
  const dropped: Partial<Record<FilterField, number>> = {};
  const asked = filtersAsked(filters);
  if (asked.length === 0) return { kept: items, dropped };
  for (const field of asked) dropped[field] = 0;
  const kept: T[] = [];
  for (const item of items) {
    const failed = firstFailure(item, filters, plan);
    if (failed !== undefined) {
      dropped[failed] = (dropped[failed] ?? 0) + 1;
      continue;
    }
    const discussionOk = item.discussionUrl === undefined || hostAllowed(hostOfUrl(item.discussionUrl), filters);
    kept.push(discussionOk ? item : { ...item, discussionUrl: undefined });
  }
  return { kept, dropped };
}

function firstFailure(item: FilterableItem, filters: SearchFilters, plan: FilterPlan): FilterField | undefined {
  const host = hostOfUrl(item.url);
  if (filters.exclude.some((rule) => hostCovered(host, rule))) return "xd";
  if (filters.include.length > 0 && !filters.include.some((rule) => hostCovered(host, rule))) return "d";
  if (filters.language !== undefined && !statedMatches(item.language, filters.language, plan.applied.l)) return "l";
  if (filters.country !== undefined && !statedMatches(item.country, filters.country, plan.applied.c)) return "c";
  return undefined;
}

function statedMatches(stated: string | undefined, wanted: string, handling: Handling | undefined): boolean {
  if (handling === undefined || handling === "unsupported") return true;
  if (stated === undefined) return handling === "native";
  return stated === wanted;
}

/** The report's `filters` entry: one outcome per asked filter; undefined when none was asked. */
export function filterReport(filters: SearchFilters, plan: FilterPlan, dropped: Partial<Record<FilterField, number>>): MessageInitShape<typeof SourceFiltersSchema> | undefined {
  const asked = filtersAsked(filters);
  if (asked.length === 0) return undefined;
  return Object.fromEntries(asked.map((field) => [field, { applied: plan.applied[field] ?? "unsupported", dropped: dropped[field] ?? 0 }]));
}

/**
 * The domain part of a plan for a source whose results all live on one site
 * (GitHub, arXiv, a Wikipedia): choosing the source is the native filter.
 * When the domains refuse that site, nothing it returns could reach the
 * caller, so it is not called.
 */
export function siteDomainPlan(site: string, filters: SearchFilters): Pick<FilterPlan, "applied" | "cannotServe"> {
  const applied: Partial<Record<FilterField, Handling>> = { d: "native", xd: "native" };
  if (filters.exclude.some((rule) => hostCovered(site, rule))) {
    return { applied, cannotServe: { field: "xd", reason: `xd excludes ${site}, the only site this source searches` } };
  }
  if (filters.include.length > 0 && !filters.include.some((rule) => hostCovered(site, rule))) {
    return { applied, cannotServe: { field: "d", reason: `d does not include ${site}, the only site this source searches` } };
  }
  return { applied };
}
