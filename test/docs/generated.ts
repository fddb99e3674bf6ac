import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { createKnex } from "../../src/db/database.js";
import { loadConfig, SETTING_MEANINGS, type SettingRead } from "../../src/config.js";
import type { Meter } from "../../src/metering/meter.js";
import { createMetrics } from "../../src/metrics.js";
import { parseSourceCatalog, type RateLimit } from "../../src/search/source-config.js";
import { create } from "@bufbuild/protobuf";
import { SearchRequestSchema } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { createLogger } from "../../src/logger.js";
import { FACTORIES } from "../../src/search/engine.js";
import { completePlan, FILTER_FIELDS, readFilters } from "../../src/search/filters.js";
import { renderErrorTable } from "./error-table.js";

/**
 * The regions of README.md and docs/ that are made from the code, between
 * `<!-- generated: KIND [only=PREFIX,…] [except=PREFIX,…] -->` and
 * `<!-- end generated -->`. KIND is errors (src/errors.ts), settings
 * (src/config.ts), metrics (src/metrics.ts), sources (the search sources'
 * defaults, src/search/source-config.ts) or filters (how each source's
 * adapter plans each filter, src/search/sources/). `npm run docs:generate`
 * rewrites them in place; test/docs/docs.test.ts fails while one is stale.
 * Everything outside the markers is written by hand, so a merge that adds a
 * setting only needs the command run again.
 */
const root = path.resolve(import.meta.dirname, "../..");
const REGION = /(<!-- generated: (\w+)((?: [a-z]+=[^ >]+)*) -->)\n(?:[\s\S]*?\n)??(<!-- end generated -->)/g;

/** Every variable loadConfig reads, in the order of SETTING_MEANINGS, then any it reads that has no meaning yet. */
export function settingsRead(): SettingRead[] {
  const read = new Map<string, SettingRead>();
  loadConfig({}, "/", (setting) => void read.set(setting.name, setting));
  const ordered = Object.keys(SETTING_MEANINGS).flatMap((name) => read.get(name) ?? []);
  return [...ordered, ...[...read.values()].filter((s) => !(s.name in SETTING_MEANINGS))];
}

function rangeOf(setting: SettingRead): string {
  if (!setting.range) return "";
  const [min, max] = setting.range;
  return max === Number.MAX_SAFE_INTEGER ? `≥ ${min}` : `${min} to ${max}`;
}

function renderSettings(filter: Filter): string {
  const rows = settingsRead()
    .filter((s) => filter(s.name))
    .map((s) => `| \`${s.name}\` | ${s.defaultText ?? (s.default === undefined ? "none" : `\`${s.default}\``)} | ${rangeOf(s)} | ${SETTING_MEANINGS[s.name] ?? "**no meaning in SETTING_MEANINGS**"} |`);
  return ["| variable | default | range | meaning |", "|---|---|---|---|", ...rows].join("\n");
}

/** The service's metrics as registered (prom-client's own process_* and nodejs_* ones summed up in one row). */
export async function metricsRegistered(): Promise<{ name: string; type: string; labels: string[]; help: string }[]> {
  // Registering reads nothing from the meter or the database: a knex that never connects does (on an external URL, so the primary's metrics are there too).
  const db = createKnex("postgres://127.0.0.1:1/none", 1);
  try {
    const metrics = createMetrics({ meter: {} as Meter, db, liveSessions: async () => 0 });
    return metrics.registry
      .getMetricsAsArray()
      .map((m) => {
        const metric = m as unknown as { name: string; help: string; labelNames?: string[]; type?: string; constructor: { name: string } };
        return { name: metric.name, type: metric.constructor.name.toLowerCase(), labels: metric.labelNames ?? [], help: metric.help };
      })
      .filter((m) => m.name.startsWith("typesafe_"));
  } finally {
    await db.destroy();
  }
}

async function renderMetrics(filter: Filter): Promise<string> {
  const rows = (await metricsRegistered())
    .filter((m) => filter(m.name))
    .map((m) => `| \`${m.name}\` | ${m.type} | ${m.labels.join(", ")} | ${m.help} |`);
  return ["| metric | type | labels | meaning |", "|---|---|---|---|", ...rows, "| `process_*`, `nodejs_*` | | | prom-client's default process metrics |"].join("\n");
}

const SPANS: [ms: number, unit: string][] = [[86_400_000, "day"], [3_600_000, "h"], [60_000, "min"], [1000, "s"]];

/** A budget as people say it: `20/s`, `300/day`, `1 per 3 s`. */
function budgetOf({ count, intervalMs }: RateLimit): string {
  const [ms, unit] = SPANS.find(([ms]) => intervalMs % ms === 0) ?? [1, "ms"];
  const n = intervalMs / ms;
  return n === 1 ? `${count}/${unit}` : `${count} per ${n} ${unit}`;
}

/**
 * The search sources with their defaults, as the catalog parses them with no
 * variable set; a key is optional where setting one changes the budget.
 */
function renderSources(): string {
  const bare = parseSourceCatalog({}).entries;
  const keyed = parseSourceCatalog(Object.fromEntries(bare.map((e) => [`TYPESAFE_SEARCH_${e.id.toUpperCase()}_KEY`, "k"]))).entries;
  const rows = bare.map((e, i) => {
    const withKey = keyed[i]!;
    const optional = withKey.rate.count !== e.rate.count || withKey.rate.intervalMs !== e.rate.intervalMs;
    const key = !e.configured ? "required" : optional ? "optional" : "–";
    const budget = budgetOf(e.rate) + (optional ? ` (${budgetOf(withKey.rate)} with a key)` : "");
    return `| ${e.id} | ${e.kind} | ${key} | ${e.supportsTimeWindow ? "yes" : "no (`skipped`)"} | ${e.isDefault ? "yes" : "no"} | ${e.priceUnits / 1_000_000} | ${budget} | ${e.rate.concurrency} | ${e.timeoutMs / 1000} s |`;
  });
  return ["| id | kind | key | `24h`/`7d`/`30d` | default | price (credits) | budget per process | in flight | timeout |", "|---|---|---|---|---|---|---|---|---|", ...rows].join("\n");
}

/**
 * Filter × source, from each adapter's own plan for one filter at a time
 * (a domain to keep, one to drop, `l=de`, `c=DE`, `safe=strict`) on the
 * provider's default base URL, with the parameter it names for the native ones.
 */
function renderFilters(): string {
  const catalog = parseSourceCatalog({});
  const samples: Record<string, { d?: string[]; xd?: string[]; l?: string; c?: string; safe?: string }> = { d: { d: ["example.org"] }, xd: { xd: ["example.net"] }, l: { l: "de" }, c: { c: "DE" }, safe: { safe: "strict" } };
  const rows = catalog.entries.map((entry) => {
    const adapter = FACTORIES[entry.id]({ baseUrl: entry.baseUrl, key: entry.key, userAgent: catalog.userAgent, logger: createLogger("silent") });
    const cells = FILTER_FIELDS.map((field) => {
      const filters = readFilters(create(SearchRequestSchema, { q: "q", ...samples[field] }));
      const plan = completePlan(filters, adapter.planFilters?.(filters, "q"));
      const applied = plan.applied[field];
      if (applied === "native") return `native: ${adapter.filterParameters?.[field] ?? "**no parameter named**"}`;
      if (applied === "post_filtered") return field === "l" || field === "c" ? "post-filter (stated per result)" : "post-filter (result host)";
      return "unsupported (kept)";
    });
    return `| ${entry.id} | ${cells.join(" | ")} |`;
  });
  return ["| source | `d` | `xd` | `l` | `c` | `safe` |", "|---|---|---|---|---|---|", ...rows].join("\n");
}

type Filter = (name: string) => boolean;

function filterOf(options: string): Filter {
  const only = /only=([^ ]+)/.exec(options)?.[1]?.split(",");
  const except = /except=([^ ]+)/.exec(options)?.[1]?.split(",") ?? [];
  return (name) => (!only || only.some((p) => name.startsWith(p))) && !except.some((p) => name.startsWith(p));
}

async function render(kind: string, options: string): Promise<string> {
  if (kind === "errors") return renderErrorTable();
  if (kind === "settings") return renderSettings(filterOf(options));
  if (kind === "metrics") return renderMetrics(filterOf(options));
  if (kind === "sources") return renderSources();
  if (kind === "filters") return renderFilters();
  throw new Error(`unknown generated region "${kind}"`);
}

/** The page with every generated region made fresh. */
export async function regenerate(markdown: string): Promise<string> {
  const regions = [...markdown.matchAll(REGION)];
  let out = markdown;
  for (const [whole, open, kind, options, close] of regions) {
    const fresh = `${open}\n${await render(kind!, options ?? "")}\n${close}`;
    out = out.replace(whole, () => fresh);
  }
  return out;
}

/** The pages that may hold generated regions. */
export function pagesWithRegions(): string[] {
  const docs = fs.readdirSync(path.join(root, "docs")).filter((f) => f.endsWith(".md")).map((f) => `docs/${f}`);
  return ["README.md", ...docs].filter((page) => fs.readFileSync(path.join(root, page), "utf8").includes("<!-- generated: "));
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  for (const page of pagesWithRegions()) {
    const file = path.join(root, page);
    const before = fs.readFileSync(file, "utf8");
    const after = await regenerate(before);
    if (after !== before) {
      fs.writeFileSync(file, after);
      console.log(`updated ${page}`);
    }
  }
}
