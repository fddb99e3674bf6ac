import { callUpstream, endpoint, failForStatus } from "./call-upstream.js";
import { readText } from "./read-answer.js";
import { retryAfterMs } from "./retry-after.js";
import { SourceFailure } from "./source-failure.js";
import type { SearchSource, SourceSettings } from "./types.js";
import { windowCutoffMs } from "./window.js";
import { siteDomainPlan, type FilterPlan, type SearchFilters } from "../filters.js";

/** Every result is an abstract page on arxiv.org; arXiv states no language or country per paper. */
export function arxivPlan(filters: SearchFilters): FilterPlan {
  return siteDomainPlan("arxiv.org", filters);
}

/**
 * arXiv API (Atom XML). The query is each term as `all:<term>` joined with
 * AND; a window adds `submittedDate:[from TO to]` in GMT, explicit on both
 * ends (a wildcard makes the API fail). Errors come back as a feed whose one
 * entry has an id under /api/errors. The Atom fields we need are few and
 * flat, so a careful hand parser replaces an XML dependency: text stays
 * entity-escaped and normalize() decodes it exactly once.
 */
export function createArxivSource(settings: SourceSettings): SearchSource {
  return {
    id: "arxiv",
    version: 1,
    planFilters: arxivPlan,
    filterParameters: { d: "its one site, `arxiv.org`", xd: "its one site, `arxiv.org`" },
    async search(call) {
      const terms = arxivTerms(call.query);
      if (terms.length === 0) {
        throw new SourceFailure("error", "query has no terms this source can search", { upstreamFault: false });
      }
      let expression = terms.map((t) => `all:${t}`).join(" AND ");
      const cutoff = windowCutoffMs(call.window, call.nowMs);
      if (cutoff !== undefined) expression += ` AND submittedDate:[${arxivMinute(cutoff)} TO ${arxivMinute(call.nowMs)}]`;
      const url = endpoint(settings.baseUrl, "/api/query");
      url.searchParams.set("search_query", expression);
      url.searchParams.set("start", "0");
      url.searchParams.set("max_results", "10");
      url.searchParams.set("sortBy", "relevance");
      url.searchParams.set("sortOrder", "descending");
      const res = await callUpstream(settings, url, call, { headers: { Accept: "application/atom+xml" } });
      if (res.status === 503) {
        throw new SourceFailure("rate_limited", "upstream is shedding load", { retryAfterMs: retryAfterMs(res.headers, call.nowMs) });
      }
      if (res.status === 400) throw new SourceFailure("error", "upstream rejected the search", { upstreamFault: false });
      failForStatus(res, call.nowMs);
      return { items: parseArxivFeed(await readText(res)) };
    },
  };
}

/** Terms safe inside arXiv's query syntax: no quotes, brackets or field prefixes, no bare operators. */
export function arxivTerms(query: string): string[] {
  return query
    .split(/\s+/)
    .map((t) => t.replace(/[^\p{L}\p{N}\-.+_']/gu, ""))
    .filter((t) => t !== "" && !/^(AND|OR|ANDNOT|TO)$/i.test(t));
}

/** YYYYMMDDHHMM in GMT, the form submittedDate ranges take. */
export function arxivMinute(ms: number): string {
  return new Date(ms).toISOString().slice(0, 16).replace(/[-T:]/g, "");
}

/** Entries of an arXiv Atom feed; throws SourceFailure on an error feed or a body that is not a feed. */
export function parseArxivFeed(xml: string) {
  if (!/<feed[\s>]/.test(xml)) throw new SourceFailure("error", "upstream sent a non-Atom answer");
  const entries = [...xml.matchAll(/<entry(?:\s[^>]*)?>([\s\S]*?)<\/entry>/g)].map((m) => m[1]!);
  return entries.map((entry) => {
    const id = unescapeXml(field(entry, "id"));
    if (/arxiv\.org\/api\/errors/.test(id)) {
      throw new SourceFailure("error", "upstream rejected the search", { upstreamFault: false });
    }
    const arxivId = /\/abs\/(.+?)(v\d+)?$/.exec(id)?.[1];
    const doi = field(entry, "arxiv:doi");
    const published = field(entry, "published").trim();
    return {
      title: field(entry, "title"),
      url: arxivId ? `https://arxiv.org/abs/${arxivId}` : "",
      snippet: field(entry, "summary"),
      publishedAt: published === "" ? null : published,
      doi: doi === "" ? undefined : unescapeXml(doi).trim(),
      arxivId,
    };
  });
}

/** The text of the first <tag> in a block, CDATA re-escaped so every field is escaped text. */
function field(block: string, tag: string): string {
  const match = new RegExp(`<${tag}(?:\\s[^>]*)?>([\\s\\S]*?)</${tag}>`).exec(block);
  if (!match) return "";
  return match[1]!.replace(/<!\[CDATA\[([\s\S]*?)\]\]>/g, (_, text: string) =>
    text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;"),
  );
}

function unescapeXml(text: string): string {
  return text.replace(/&(lt|gt|quot|apos|amp);/g, (_, e: string) => ({ lt: "<", gt: ">", quot: '"', apos: "'", amp: "&" })[e] ?? "");
}
