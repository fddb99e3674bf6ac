import { ConfigError } from "../config-error.js";
import type { SettingRead } from "../setting-read.js";
import { SOURCE_IDS, type SourceId } from "./validate.js";

/**
 * The source catalog and its operator settings, parsed from the
 * TYPESAFE_SEARCH_* variables that config.ts collects. Kept apart from the
 * engine so a bad value is reported at start-up, all problems at once, rather
 * than on the first search.
 *
 * Each source reads TYPESAFE_SEARCH_<ID>_<SETTING> for the settings of
 * PER_SOURCE_SETTINGS (ID is the upper-case id, e.g. BRAVE); all sources share
 * TYPESAFE_SEARCH_SOURCES, _CONTACT and _CACHE_ENTRIES, read here, and
 * _REQUEST_TIMEOUT_MS, read by config.ts. What each means is written once, in
 * config.ts's SETTING_MEANINGS, from which docs/search.md's table is generated.
 */
export type SourceKind = "web" | "reference" | "news" | "forum" | "code" | "papers";

export interface RateLimit {
  /** Calls allowed per interval; also the burst size. */
  count: number;
  intervalMs: number;
  /** Calls in flight at once (arXiv and GDELT want one connection). */
  concurrency: number;
}

export interface SourceEntry {
  id: SourceId;
  kind: SourceKind;
  /** False when disabled by TYPESAFE_SEARCH_SOURCES or a required key is missing. */
  configured: boolean;
  supportsTimeWindow: boolean;
  isDefault: boolean;
  priceUnits: number;
  weight: number;
  timeoutMs: number;
  rate: RateLimit;
  baseUrl: string;
  key: string | undefined;
  /** Position in the catalog: the fan-out order and the fusion tie-break. */
  order: number;
}

export interface SourceCatalog {
  entries: SourceEntry[];
  userAgent: string;
  cacheEntries: number;
  /** Non-fatal findings for the start-up log (unknown variables, keyed source without key). */
  warnings: string[];
}

interface Defaults {
  kind: SourceKind;
  supportsTimeWindow: boolean;
  isDefault: boolean;
  keyRequired: boolean;
  priceUnits: number;
  timeoutMs: number;
  rate: RateLimit;
  /** Budget when an optional key is set (GitHub 30/min with a token, Stack Exchange 10,000/day with a key). */
  keyedRate?: RateLimit;
  baseUrl: string;
}

const SECOND = 1000;
const MINUTE = 60 * SECOND;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

/**
 * Each provider's documented limits and prices. Prices assume 1 credit ≈ US$1:
 * the keyed indexes cost their upstream list price plus a margin; free sources
 * carry a small fee for our own bandwidth and quota.
 */
const DEFAULTS: Record<SourceId, Defaults> = {
  brave: {
    kind: "web", supportsTimeWindow: true, isDefault: true, keyRequired: true, priceUnits: 6000, timeoutMs: 5000,
    rate: { count: 20, intervalMs: SECOND, concurrency: 20 }, baseUrl: "https://api.search.brave.com",
  },
  exa: {
    kind: "web", supportsTimeWindow: true, isDefault: true, keyRequired: true, priceUnits: 8000, timeoutMs: 5000,
    rate: { count: 5, intervalMs: SECOND, concurrency: 5 }, baseUrl: "https://api.exa.ai",
  },
  wikipedia: {
    kind: "reference", supportsTimeWindow: false, isDefault: true, keyRequired: false, priceUnits: 500, timeoutMs: 4000,
    rate: { count: 10, intervalMs: SECOND, concurrency: 2 }, baseUrl: "https://en.wikipedia.org",
  },
  hackernews: {
    kind: "forum", supportsTimeWindow: true, isDefault: true, keyRequired: false, priceUnits: 500, timeoutMs: 4000,
    rate: { count: 10_000, intervalMs: HOUR, concurrency: 8 }, baseUrl: "https://hn.algolia.com",
  },
  stackoverflow: {
    kind: "forum", supportsTimeWindow: true, isDefault: false, keyRequired: false, priceUnits: 500, timeoutMs: 4000,
    rate: { count: 300, intervalMs: DAY, concurrency: 4 }, keyedRate: { count: 10_000, intervalMs: DAY, concurrency: 4 },
    baseUrl: "https://api.stackexchange.com",
  },
  github: {
    kind: "code", supportsTimeWindow: true, isDefault: false, keyRequired: false, priceUnits: 500, timeoutMs: 5000,
    rate: { count: 10, intervalMs: MINUTE, concurrency: 4 }, keyedRate: { count: 30, intervalMs: MINUTE, concurrency: 4 },
    baseUrl: "https://api.github.com",
  },
  arxiv: {
    kind: "papers", supportsTimeWindow: true, isDefault: false, keyRequired: false, priceUnits: 500, timeoutMs: 7000,
    rate: { count: 1, intervalMs: 3 * SECOND, concurrency: 1 }, baseUrl: "https://export.arxiv.org",
  },
  gdelt: {
    // GDELT sheds load with a late 429 (koala73/worldmonitor#5843), so its timeout is longer (the search
    // deadline still bounds it), and calls are paced wider than the interval it asks for, which still drew 429s.
    kind: "news", supportsTimeWindow: true, isDefault: true, keyRequired: false, priceUnits: 500, timeoutMs: 15_000,
    rate: { count: 1, intervalMs: 6 * SECOND, concurrency: 1 }, baseUrl: "https://api.gdeltproject.org",
  },
};

/** Sources whose operators ask for a contact in the User-Agent. */
const NEEDS_CONTACT = new Set<SourceId>(["wikipedia", "gdelt"]);

const PER_SOURCE_SETTINGS = ["KEY", "URL", "PRICE_UNITS", "DEFAULT", "WEIGHT", "TIMEOUT_MS", "RATE", "CONCURRENCY"];
/** The TYPESAFE_SEARCH_ variables that are not per source (REQUEST_TIMEOUT_MS and MIN_SAFE are read by config.ts). */
const GLOBAL_SETTINGS = ["SOURCES", "CONTACT", "CACHE_ENTRIES", "REQUEST_TIMEOUT_MS", "MIN_SAFE"];

/**
 * Parses the catalog; throws ConfigError listing every bad value. `onRead`
 * hears of each variable once, a per-source one under its `<ID>` form.
 */
export function parseSourceCatalog(env: Record<string, string>, onRead?: (setting: SettingRead) => void): SourceCatalog {
  const problems: string[] = [];
  const warnings: string[] = [];
  const get = (name: string): string | undefined => {
    const raw = env[`TYPESAFE_SEARCH_${name}`]?.trim();
    return raw ? raw : undefined;
  };
  const heard = new Set<string>();
  const report = (setting: SettingRead) => {
    if (heard.has(setting.name)) return;
    heard.add(setting.name);
    onRead?.(setting);
  };
  const perSource = "per source";

  report({ name: "TYPESAFE_SEARCH_SOURCES", default: undefined, defaultText: "all" });
  const enabled = parseEnabled(get("SOURCES"), problems);
  report({ name: "TYPESAFE_SEARCH_CONTACT", default: undefined });
  const contact = get("CONTACT");
  if (contact !== undefined && /[\r\n()]/.test(contact)) {
    problems.push(`TYPESAFE_SEARCH_CONTACT: must be an e-mail address or URL without parentheses or newlines, got "${contact}"`);
  }
  const userAgent = `typesafe-search/1.0 (+${contact && !/[\r\n()]/.test(contact) ? contact : "contact not configured"})`;

  report({ name: "TYPESAFE_SEARCH_CACHE_ENTRIES", default: "5000", range: [0, 1_000_000] });
  const cacheEntries = parseInteger("TYPESAFE_SEARCH_CACHE_ENTRIES", get("CACHE_ENTRIES"), 5000, 0, 1_000_000, problems);

  const entries = SOURCE_IDS.map((id, order): SourceEntry => {
    const d = DEFAULTS[id];
    const upper = id.toUpperCase();
    const name = (setting: string) => `TYPESAFE_SEARCH_${upper}_${setting}`;
    /** One of this source's values; the settings tables hear of it under its <ID> form. */
    const raw = (setting: string, shown: Omit<SettingRead, "name"> = { default: undefined, defaultText: perSource }) => {
      report({ name: `TYPESAFE_SEARCH_<ID>_${setting}`, ...shown });
      return get(`${upper}_${setting}`);
    };
    const int = (setting: string, fallback: number, min: number, max: number) =>
      parseInteger(name(setting), raw(setting, { default: undefined, defaultText: perSource, range: [min, max] }), fallback, min, max, problems);
    const key = raw("KEY", { default: undefined });
    const baseUrl = parseBaseUrl(name("URL"), raw("URL", { default: undefined, defaultText: "the provider's" }), d.baseUrl, problems);
    const isEnabled = enabled === undefined || enabled.has(id);
    if (isEnabled && d.keyRequired && key === undefined) {
      warnings.push(`${id} is not configured: ${name("KEY")} is not set`);
    }
    return {
      id,
      kind: d.kind,
      configured: isEnabled && (!d.keyRequired || key !== undefined),
      supportsTimeWindow: d.supportsTimeWindow,
      isDefault: parseBoolean(name("DEFAULT"), raw("DEFAULT"), d.isDefault, problems),
      priceUnits: int("PRICE_UNITS", d.priceUnits, 0, 1_000_000_000),
      weight: parseWeight(name("WEIGHT"), raw("WEIGHT", { default: String(DEFAULT_WEIGHT) }), problems),
      timeoutMs: int("TIMEOUT_MS", d.timeoutMs, 50, 120_000),
      rate: {
        ...parseRate(name("RATE"), raw("RATE"), key !== undefined && d.keyedRate ? d.keyedRate : d.rate, problems),
        concurrency: int("CONCURRENCY", d.rate.concurrency, 1, 1000),
      },
      baseUrl,
      key,
      order,
    };
  });

  if (contact === undefined && entries.some((e) => e.configured && NEEDS_CONTACT.has(e.id))) {
    warnings.push("TYPESAFE_SEARCH_CONTACT is not set: Wikimedia and GDELT may block requests without a contact");
  }

  const known = new Set([
    ...GLOBAL_SETTINGS,
    ...SOURCE_IDS.flatMap((id) => PER_SOURCE_SETTINGS.map((s) => `${id.toUpperCase()}_${s}`)),
  ]);
  for (const variable of Object.keys(env).sort()) {
    const rest = variable.slice("TYPESAFE_SEARCH_".length);
    if (variable.startsWith("TYPESAFE_SEARCH_") && !known.has(rest)) {
      warnings.push(`${variable} is not a known search setting and is ignored`);
    }
  }

  if (problems.length > 0) throw new ConfigError(problems);
  return { entries, userAgent, cacheEntries, warnings };
}

function parseEnabled(raw: string | undefined, problems: string[]): Set<SourceId> | undefined {
  if (raw === undefined) return undefined;
  if (raw.toLowerCase() === "none") return new Set();
  const ids = raw.split(",").map((s) => s.trim()).filter((s) => s !== "");
  const unknown = ids.filter((id) => !(SOURCE_IDS as readonly string[]).includes(id));
  if (unknown.length > 0) {
    problems.push(`TYPESAFE_SEARCH_SOURCES: unknown source ids ${unknown.map((u) => `"${u}"`).join(", ")}; allowed: ${SOURCE_IDS.join(", ")} (or "none")`);
  }
  return new Set(ids.filter((id): id is SourceId => (SOURCE_IDS as readonly string[]).includes(id)));
}

function parseBaseUrl(name: string, raw: string | undefined, fallback: string, problems: string[]): string {
  if (raw === undefined) return fallback;
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    problems.push(`${name}: must be an absolute http(s) URL, got "${raw}"`);
    return fallback;
  }
  if ((url.protocol !== "http:" && url.protocol !== "https:") || url.search !== "" || url.hash !== "" || url.username !== "") {
    problems.push(`${name}: must be an http(s) URL without credentials, query or fragment, got "${raw}"`);
    return fallback;
  }
  return url.href.replace(/\/+$/, "");
}

function parseInteger(name: string, raw: string | undefined, fallback: number, min: number, max: number, problems: string[]): number {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!/^\d+$/.test(raw) || value < min || value > max) {
    problems.push(`${name}: must be an integer between ${min} and ${max}, got "${raw}"`);
    return fallback;
  }
  return value;
}

function parseBoolean(name: string, raw: string | undefined, fallback: boolean, problems: string[]): boolean {
  if (raw === undefined) return fallback;
  if (raw === "true") return true;
  if (raw === "false") return false;
  problems.push(`${name}: must be true or false, got "${raw}"`);
  return fallback;
}

const DEFAULT_WEIGHT = 1;

function parseWeight(name: string, raw: string | undefined, problems: string[]): number {
  if (raw === undefined) return DEFAULT_WEIGHT;
  const value = Number(raw);
  if (!/^\d+(\.\d+)?$/.test(raw) || !(value > 0) || value > 100) {
    problems.push(`${name}: must be a number greater than 0 and at most 100, got "${raw}"`);
    return DEFAULT_WEIGHT;
  }
  return value;
}

const UNIT_MS: Record<string, number> = { s: SECOND, m: MINUTE, h: HOUR, d: DAY };

function parseRate(name: string, raw: string | undefined, fallback: RateLimit, problems: string[]): RateLimit {
  if (raw === undefined) return fallback;
  const match = /^(\d+)\/(\d*)([smhd])$/.exec(raw);
  const count = Number(match?.[1]);
  const span = match?.[2] === "" ? 1 : Number(match?.[2]);
  if (!match || !(count >= 1) || !(span >= 1)) {
    problems.push(`${name}: must look like <count>/<n><s|m|h|d> with positive numbers, e.g. 10/1m, got "${raw}"`);
    return fallback;
  }
  return { count, intervalMs: span * UNIT_MS[match[3]!]!, concurrency: fallback.concurrency };
}
