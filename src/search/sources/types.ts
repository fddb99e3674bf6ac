import type { Logger } from "../../logger.js";
import type { FilterField, FilterPlan, SearchFilters } from "../filters.js";
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
  /**
   * Pure: how this provider takes each asked filter (its own parameter, or
   * not at all), whether it can serve them at all, and how many results to
   * ask for when typesafe's check may drop some. Without it, domains are
   * checked by typesafe and the other filters are unsupported.
   */
  planFilters?(filters: SearchFilters, query: string): FilterPlan;
  /** The provider's own parameter for each filter it takes natively, in words for the docs' filter table. */
  readonly filterParameters?: Partial<Record<FilterField, string>>;
  /** One upstream call. Resolves with the provider's items in its own order; throws SourceFailure. */
  search(call: SourceCall): Promise<SourceAnswer>;
}

/** One search as the engine hands it to an adapter. */
export interface SourceCall {
  /** Trimmed, NFC, whitespace collapsed. */
  query: string;
  window: SearchWindow;
  /** Request time T (ms since epoch) from the injected clock; windows are computed from it. */
  nowMs: number;
  /** Fires on the source's timeout, the overall deadline or the caller's cancellation. */
  signal: AbortSignal;
  /** The request's filters, and how this source applies them (its planFilters answer, completed by the engine); absent: none. */
  filters?: SearchFilters;
  plan?: FilterPlan;
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
  /** The result's language as an ISO 639-1 code, when the provider states one. */
  language?: string | undefined;
  /** The result's country as an ISO 3166-1 alpha-2 code, when the provider states one. */
  country?: string | undefined;
}

/** What an adapter returns from one successful upstream call. */
export interface SourceAnswer {
  items: RawItem[];
  /** Fixed text shown as the report's reason on an ok answer (e.g. incomplete upstream results). */
  note?: string;
  /** The upstream asked us to pause (Stack Exchange `backoff`, an exhausted daily quota). */
  pauseMs?: number;
}

/** What every adapter factory receives; parsed by source-config.ts. */
export interface SourceSettings {
  /** Scheme, host and optional path prefix, without a trailing slash. */
  baseUrl: string;
  key: string | undefined;
  userAgent: string;
  logger: Logger;
}
