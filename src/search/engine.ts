import type { Metrics } from "../metrics.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { performance } from "node:perf_hooks";
import type { SearchConfig } from "../config.js";
import { apiError } from "../errors.js";
import type {
  ResultSchema,
  SearchRequest,
  SearchUsageSchema,
  SourceInfoSchema,
  SourceReportSchema,
} from "../gen/typesafe/search/v1/search_service_pb.js";
import type { Logger } from "../logger.js";
import { unitsToCredits } from "../units.js";
import { cacheKey, createSingleFlight, createTtlCache, EMPTY_TTL_MS, normalizeQuery, TTL_MS } from "./cache.js";
import { fuse, normalizeItems, postFilter, type NormalizedItem, type RankedList } from "./merge.js";
import { applyFilters, completePlan, filterReport, filtersAsked, filtersKey, PAGE_SIZE, readFilters, type FilterPlan, type SearchFilters } from "./filters.js";
import { createRateGate } from "./rate-gate.js";
import { linkedSignal, type LinkedSignal } from "../abort-signals.js";
import { parseSourceCatalog, type SourceEntry } from "./source-config.js";
import { createArxivSource } from "./sources/arxiv.js";
import { createBraveSource } from "./sources/brave.js";
import { createExaSource } from "./sources/exa.js";
import { createGdeltSource } from "./sources/gdelt.js";
import { createGitHubSource } from "./sources/github.js";
import { createHackerNewsSource } from "./sources/hackernews.js";
import { createStackOverflowSource } from "./sources/stackoverflow.js";
import { createWikipediaSource } from "./sources/wikipedia.js";
import { SourceFailure } from "./sources/source-failure.js";
import type { SearchSource, SourceSettings } from "./sources/types.js";
import { windowCutoffMs } from "./sources/window.js";
import { SOURCE_IDS, WINDOWS, type SearchWindow, type SourceId } from "./validate.js";

export interface SearchPlan {
  /** Resolved, configured sources in catalog order (echoed as `s`). */
  sources: string[];
  /** Requested sources that are not configured: reported as not_configured, cost 0. */
  notConfigured: string[];
  window: "any" | "24h" | "7d" | "30d";
  /** The request's filters (none: empty lists, nothing else set). */
  filters: SearchFilters;
  /** How each resolved source applies the filters, by source id. */
  filterPlans: Map<string, FilterPlan>;
  /**
   * Sum of the prices (integer units) of every resolved source that can run
   * under the window. A source skipped because it cannot filter by time can
   * never be charged, so reserving for it would only cause spurious 402s.
   */
  reserveUnits: number;
}

export interface SearchOutcome {
  /** The query as searched (normalized). */
  query: string;
  results: MessageInitShape<typeof ResultSchema>[];
  sources: MessageInitShape<typeof SourceReportSchema>[];
  usage: MessageInitShape<typeof SearchUsageSchema>;
  /** Sum of prices of sources whose upstream call answered (ok/empty); cache hits cost 0. */
  chargeUnits: number;
}

export interface SearchEngine {
  list(): MessageInitShape<typeof SourceInfoSchema>[];
  /**
   * Pure: resolves defaults for s and w; throws apiError INVALID_ARGUMENT
   * (field "s" or "w", naming bad/allowed ids, or a w that no requested source
   * can honour) or NOT_CONFIGURED when nothing is configured.
   */
  resolve(request: SearchRequest): SearchPlan;
  /** Fans out, merges. Throws apiError("UPSTREAM_FAILED") when no source answered. Honours signal. */
  search(plan: SearchPlan, query: string, signal: AbortSignal): Promise<SearchOutcome>;
  /** Stops timers if any; the engine holds none between searches. */
  close(): void;
}

export type SourceStatus = "ok" | "empty" | "skipped" | "filtered_out" | "not_configured" | "suspended" | "rate_limited" | "timeout" | "error";

/** Room left between the fan-out deadline and the RPC deadline for merging and settling. */
export const DEADLINE_MARGIN_MS = 250;
/** Suspension after a 429 without Retry-After (SearXNG's value). */
export const DEFAULT_SUSPENSION_MS = 180_000;
/**
 * How long a refused key or User-Agent holds a source as not_configured
 * before one call checks again (keys can be refused transiently: Brave's
 * intermittent 422, nearai/ironclaw#2780). A used-up quota holds until the
 * provider's own reset when it states one.
 */
export const OPERATOR_RECHECK_MS = 600_000;

/** Each source id's adapter factory (the docs' filter table builds them too). */
export const FACTORIES: Record<SourceId, (settings: SourceSettings) => SearchSource> = {
  brave: createBraveSource,
  exa: createExaSource,
  wikipedia: createWikipediaSource,
  hackernews: createHackerNewsSource,
  stackoverflow: createStackOverflowSource,
  github: createGitHubSource,
  arxiv: createArxivSource,
  gdelt: createGdeltSource,
};

interface CachedAnswer {
  items: NormalizedItem[];
  note: string | undefined;
}

/** What one shared upstream attempt produced; followers of a single flight see the same value. */
type Attempt =
  | { status: "ok"; items: NormalizedItem[]; note: string | undefined; called: true }
  | { status: "suspended" | "rate_limited" | "timeout" | "error" | "not_configured"; reason: string; called: boolean };

interface SourceRun {
  report: MessageInitShape<typeof SourceReportSchema> & { status: SourceStatus };
  items: NormalizedItem[];
  chargedUnits: number;
  called: boolean;
}

/**
 * The search engine: catalog, adapters, rate gate and cache are built once
 * per process (upstream limits are per IP/key, so their state must be shared
 * by all requests). Deadlines use real timers; the injected clock is the
 * request time T for windows, cache TTLs and rate budgets.
 */
export function createSearchEngine(deps: {
  config: SearchConfig;
  logger: Logger;
  now?: () => number;
  metrics?: Pick<Metrics, "recordSearchSource" | "recordSearchFilterDrops">;
}): SearchEngine {
  const now = deps.now ?? Date.now;
  const logger = deps.logger.child({ component: "search" });
  const catalog = parseSourceCatalog(deps.config.env);
  for (const warning of catalog.warnings) logger.warn(warning);

  const entries = new Map<string, SourceEntry>(catalog.entries.map((e) => [e.id, e]));
  const adapters = new Map<string, SearchSource>(
    catalog.entries.map((e) => [
      e.id,
      FACTORIES[e.id]({ baseUrl: e.baseUrl, key: e.key, userAgent: catalog.userAgent, logger: logger.child({ source: e.id }) }),
    ]),
  );
  const gate = createRateGate({ limits: Object.fromEntries(catalog.entries.map((e) => [e.id, e.rate])), now });
  const cache = createTtlCache<CachedAnswer>({ now, maxEntries: catalog.cacheEntries });
  const flights = createSingleFlight<Attempt>();
  const deadlineMs = Math.max(100, deps.config.requestTimeoutMs - DEADLINE_MARGIN_MS);
  const canRun = (entry: SourceEntry, window: SearchWindow) => window === "any" || entry.supportsTimeWindow;
  /** Sources held back by the operator's key, User-Agent or quota, with the reason shown to callers. */
  const operatorHolds = new Map<string, { reason: string; untilMs: number }>();
  const heldReason = (id: string): string | undefined => {
    const hold = operatorHolds.get(id);
    if (hold && hold.untilMs > now()) return hold.reason;
    operatorHolds.delete(id);
    return undefined;
  };

  /** One upstream attempt: token, call, classification, cache fill. Shared by concurrent identical requests. */
  async function attempt(entry: SourceEntry, query: string, window: SearchWindow, filters: SearchFilters, plan: FilterPlan, tMs: number, key: string, deadlineAt: number, signal: AbortSignal): Promise<Attempt> {
    const budget = () => deadlineAt - performance.now();
    let admission;
    try {
      admission = await gate.acquire(entry.id, { waitUntilMs: now() + Math.min(entry.timeoutMs / 2, budget() / 2), signal });
    } catch {
      return { status: "rate_limited", reason: "no upstream call slot before the deadline", called: false };
    }
    if (!admission.granted) {
      return admission.status === "suspended"
        ? { status: "suspended", reason: suspendedReason(admission.retryInMs), called: false }
        : { status: "rate_limited", reason: "provider budget exhausted; no call made", called: false };
    }
    const timeoutMs = Math.max(1, Math.floor(Math.min(entry.timeoutMs, budget())));
    const link = linkedSignal([signal], timeoutMs);
    try {
      return await call(entry, query, window, filters, plan, tMs, key, timeoutMs, link);
    } finally {
      link.dispose();
      admission.release();
    }
  }

  /** The upstream call itself and the classification of its outcome. */
  async function call(
    entry: SourceEntry, query: string, window: SearchWindow, filters: SearchFilters, plan: FilterPlan, tMs: number, key: string, timeoutMs: number, link: LinkedSignal,
  ): Promise<Attempt> {
    try {
      const answer = await adapters.get(entry.id)!.search({ query, window, nowMs: tMs, signal: link.signal, filters, plan });
      gate.recordSuccess(entry.id);
      if (answer.pauseMs !== undefined) gate.suspend(entry.id, answer.pauseMs);
      const items = normalizeItems(answer.items);
      cache.set(key, { items, note: answer.note }, items.length > 0 ? TTL_MS[window] : Math.min(EMPTY_TTL_MS, TTL_MS[window]));
      return { status: "ok", items, note: answer.note, called: true };
    } catch (err) {
      if (err instanceof SourceFailure) {
        if (err.kind === "auth" || err.kind === "quota") {
          // The operator must act: one log line per episode, and callers see not_configured with the reason.
          if (heldReason(entry.id) === undefined) logger.error("search source needs operator action", { source: entry.id, kind: err.kind, reason: err.reason });
          operatorHolds.set(entry.id, { reason: err.reason, untilMs: now() + (err.opts.retryAfterMs ?? OPERATOR_RECHECK_MS) });
          return { status: "not_configured", reason: err.reason, called: true };
        }
        if (err.kind === "rate_limited") {
          gate.suspend(entry.id, err.opts.retryAfterMs ?? DEFAULT_SUSPENSION_MS);
        } else if (err.upstreamFault) {
          gate.recordFailure(entry.id);
        }
        logger.warn("search source failed", { source: entry.id, kind: err.kind, reason: err.reason });
        return { status: err.kind === "rate_limited" ? "rate_limited" : "error", reason: err.reason, called: true };
      }
      if (link.timedOut()) {
        gate.recordFailure(entry.id);
        return { status: "timeout", reason: `no answer within ${timeoutMs} ms`, called: true };
      }
      if (link.signal.aborted) {
        // Every waiting caller left: not the upstream's fault, so no failure is counted.
        return { status: "timeout", reason: "the search was cancelled before this source answered", called: true };
      }
      gate.recordFailure(entry.id);
      logger.error("search source adapter failed unexpectedly", { source: entry.id, err });
      return { status: "error", reason: "unexpected failure reading the upstream answer", called: true };
    }
  }

  async function runSource(
    entry: SourceEntry, query: string, window: SearchWindow, filters: SearchFilters, plan: FilterPlan, tMs: number, deadlineAt: number, deadline: AbortSignal, caller: AbortSignal,
  ): Promise<SourceRun> {
    const started = performance.now();
    const filtered = filtersAsked(filters).length > 0;
    const finish = (
      status: SourceStatus,
      fields: { reason?: string; items?: NormalizedItem[]; cached?: boolean; charged?: boolean; called?: boolean; dropped?: Partial<Record<string, number>> } = {},
    ): SourceRun => {
      const items = fields.items ?? [];
      const chargedUnits = fields.charged ? entry.priceUnits : 0;
      const seconds = (performance.now() - started) / 1000;
      deps.metrics?.recordSearchSource(entry.id, status, seconds, fields.cached ?? false);
      return {
        report: {
          id: entry.id,
          status,
          reason: fields.reason ?? "",
          resultCount: items.length,
          latencyMs: Math.round(seconds * 1000),
          cached: fields.cached ?? false,
          costCredits: unitsToCredits(chargedUnits),
          ...(filtered ? { filters: filterReport(filters, plan, fields.dropped ?? {}) } : {}),
        },
        items,
        chargedUnits,
        called: fields.called ?? false,
      };
    };
    const answered = (items: NormalizedItem[], note: string | undefined, cached: boolean, charged: boolean) => {
      const inWindow = postFilter(items, windowCutoffMs(window, tMs));
      const { kept, dropped } = applyFilters(inWindow, filters, plan);
      if (filtered) deps.metrics?.recordSearchFilterDrops(entry.id, dropped);
      const page = (filtered ? kept.slice(0, PAGE_SIZE) : kept).map((item, i) => ({ ...item, rank: i + 1 }));
      return finish(page.length > 0 ? "ok" : "empty", { items: page, reason: note ?? "", cached, charged, called: charged, dropped });
    };

    if (!canRun(entry, window)) return finish("skipped", { reason: "source cannot filter by time window" });
    if (plan.cannotServe) return finish("filtered_out", { reason: plan.cannotServe.reason });
    const adapter = adapters.get(entry.id)!;
    const prepared = adapter.prepare?.(query) ?? { query };
    if ("skip" in prepared) return finish("skipped", { reason: prepared.skip });
    query = prepared.query;
    const key = cacheKey(entry.id, adapter.version, query, window, filtersKey(filters));
    const hit = cache.get(key);
    if (hit) return answered(hit.items, hit.note, true, false);
    const held = heldReason(entry.id);
    if (held !== undefined) return finish("not_configured", { reason: held });
    const suspended = gate.suspendedForMs(entry.id);
    if (suspended > 0) return finish("suspended", { reason: suspendedReason(suspended) });

    const waiting = linkedSignal([caller, deadline]);
    try {
      const { value, leader } = await flights.run(key, waiting.signal, (shared) =>
        attempt(entry, query, window, filters, plan, tMs, key, deadlineAt, shared),
      );
      if (value.status === "ok") return answered(value.items, value.note, !leader, leader);
      return finish(value.status, { reason: value.reason, called: leader && value.called });
    } catch (err) {
      if (caller.aborted) throw caller.reason ?? err;
      if (deadline.aborted) return finish("timeout", { reason: "no answer before the search deadline" });
      logger.error("search source failed unexpectedly", { source: entry.id, err });
      return finish("error", { reason: "unexpected failure" });
    } finally {
      waiting.dispose();
    }
  }

  return {
    list() {
      return catalog.entries.map((e) => ({
        id: e.id,
        kind: e.kind,
        configured: e.configured,
        supportsTimeWindow: e.supportsTimeWindow,
        isDefault: e.isDefault,
        priceCredits: unitsToCredits(e.priceUnits),
      }));
    },

    resolve(request) {
      const window = request.w === "" ? "any" : request.w;
      if (!(WINDOWS as readonly string[]).includes(window)) {
        throw apiError("INVALID_ARGUMENT", `w must be one of ${WINDOWS.join(", ")}`, {
          field: "w", rule: "one_of", metadata: { w: request.w, allowed: WINDOWS.join(",") },
        });
      }
      const w = window as SearchWindow;
      const unknown = request.s.filter((id) => !entries.has(id));
      if (unknown.length > 0) {
        throw apiError("INVALID_ARGUMENT", `unknown source ids ${unknown.join(", ")}; allowed: ${SOURCE_IDS.join(", ")}`, {
          field: "s", rule: "known_ids", metadata: { unknown: unknown.join(","), allowed: SOURCE_IDS.join(",") },
        });
      }
      const configured = catalog.entries.filter((e) => e.configured);
      let chosen: SourceEntry[];
      let notConfigured: string[] = [];
      if (request.s.length === 0) {
        chosen = configured.filter((e) => e.isDefault);
        if (chosen.length === 0) {
          throw apiError("NOT_CONFIGURED", configured.length === 0
            ? "search is not configured: no search source is enabled"
            : `no default search source is configured; name sources in s (configured: ${configured.map((e) => e.id).join(", ")})`,
          { metadata: { configured: configured.map((e) => e.id).join(",") } });
        }
      } else {
        const requested = catalog.entries.filter((e) => request.s.includes(e.id));
        chosen = requested.filter((e) => e.configured);
        notConfigured = requested.filter((e) => !e.configured).map((e) => e.id);
        if (chosen.length === 0) {
          throw apiError("NOT_CONFIGURED", `none of the requested search sources is configured: ${notConfigured.join(", ")}`, {
            metadata: { not_configured: notConfigured.join(","), configured: configured.map((e) => e.id).join(",") },
          });
        }
      }
      const filters = readFilters(request, deps.config.minSafe);
      const asked = filtersAsked(filters).length > 0;
      const query = normalizeQuery(request.q);
      const filterPlans = new Map(chosen.map((e) => [e.id, completePlan(filters, asked ? adapters.get(e.id)!.planFilters?.(filters, query) : undefined)]));
      const windowed = chosen.filter((e) => canRun(e, w));
      const runnable = windowed.filter((e) => !filterPlans.get(e.id)!.cannotServe);
      if (windowed.length > 0 && runnable.length === 0) {
        const first = filterPlans.get(windowed[0]!.id)!.cannotServe!;
        throw apiError("INVALID_ARGUMENT", `the filters leave nothing to search: ${windowed.map((e) => `${e.id} (${filterPlans.get(e.id)!.cannotServe!.reason})`).join("; ")}`, {
          field: first.field, rule: "leaves_a_source", metadata: { sources: windowed.map((e) => e.id).join(",") },
        });
      }
      if (runnable.length === 0) {
        const capable = configured.filter((e) => e.supportsTimeWindow).map((e) => e.id);
        throw apiError("INVALID_ARGUMENT", `w=${w} cannot be honoured by ${chosen.map((e) => e.id).join(", ")}: they cannot filter by time; sources that can: ${capable.join(", ")}`, {
          field: "w", rule: "supported_by_sources", metadata: { w, sources: chosen.map((e) => e.id).join(","), capable: capable.join(",") },
        });
      }
      return {
        sources: chosen.map((e) => e.id),
        notConfigured,
        window: w,
        filters,
        filterPlans,
        reserveUnits: runnable.reduce((sum, e) => sum + e.priceUnits, 0),
      };
    },

    async search(plan, rawQuery, signal) {
      signal.throwIfAborted();
      const query = normalizeQuery(rawQuery);
      if (query === "") throw apiError("INVALID_ARGUMENT", "q is required: a non-empty query", { field: "q", rule: "required" });
      const started = performance.now();
      const tMs = now();
      const deadlineAt = performance.now() + deadlineMs;
      const deadline = linkedSignal([], deadlineMs);
      const planned = new Set([...plan.sources, ...plan.notConfigured]);
      const runs = await Promise.all(
        catalog.entries
          .filter((e) => planned.has(e.id))
          .map((e): Promise<SourceRun> | SourceRun =>
            plan.sources.includes(e.id) && e.configured
              ? runSource(e, query, plan.window, plan.filters, plan.filterPlans.get(e.id)!, tMs, deadlineAt, deadline.signal, signal)
              : notConfiguredRun(e.id),
          ),
      ).finally(deadline.dispose);
      signal.throwIfAborted();
      const reports = runs.map((r) => r.report);
      const answered = runs.filter((r) => r.report.status === "ok" || r.report.status === "empty");
      if (answered.length === 0) {
        throw apiError("UPSTREAM_FAILED", "no search source answered", {
          metadata: Object.fromEntries(reports.map((r) => [`source_${r.id}`, r.reason ? `${r.status}: ${r.reason}` : r.status])),
        });
      }
      const lists: RankedList[] = answered.map((r) => {
        const entry = entries.get(r.report.id!)!;
        return { source: entry.id, weight: entry.weight, order: entry.order, items: r.items };
      });
      const results = fuse(lists);
      return {
        query,
        results,
        sources: reports,
        usage: {
          sourcesRequested: runs.length,
          sourcesAnswered: answered.length,
          upstreamCalls: runs.filter((r) => r.called).length,
          results: results.length,
          latencyMs: Math.round(performance.now() - started),
        },
        chargeUnits: runs.reduce((sum, r) => sum + r.chargedUnits, 0),
      };
    },

    close() {
      // No background timers: waits and timeouts are bound to each search's signals.
    },
  };
}

function notConfiguredRun(id: string): SourceRun {
  return {
    report: { id, status: "not_configured", reason: "source is not configured on this deployment", resultCount: 0, latencyMs: 0, cached: false, costCredits: 0 },
    items: [],
    chargedUnits: 0,
    called: false,
  };
}

function suspendedReason(ms: number): string {
  return `temporarily suspended after upstream failures or rate limiting; retry in ${Math.ceil(ms / 1000)} s`;
}
