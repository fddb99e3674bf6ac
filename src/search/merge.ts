import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ResultSchema } from "../gen/typesafe/search/v1/search_service_pb.js";
import type { RawItem } from "./sources/types.js";

/**
 * Normalization, deduplication and weighted reciprocal rank fusion: each
 * source's list is cleaned, items naming the same page are merged, and a page
 * scores the sum, over the sources that returned it, of weight / (RRF_K + rank).
 * Ranks decide, not the providers' scores, which cannot be compared; a page
 * several sources return rises. Pure functions, so the same inputs always give
 * the same order.
 */

export const TITLE_MAX = 300;
export const SNIPPET_MAX = 500;
export const URL_MAX = 2048;
export const RRF_K = 60;
export const MAX_RESULTS = 50;

/** An item after normalize(): safe to show, with its grouping keys. */
export interface NormalizedItem {
  title: string;
  /** The original URL (parsed and re-serialized), never the stripped key. */
  url: string;
  snippet: string;
  /** The snippet was made up by us from facts, not written by the provider. */
  generatedSnippet: boolean;
  /** A second link (the Hacker News discussion of an article), already cleaned. */
  discussionUrl: string | undefined;
  publishedAt: string | null;
  /** 1-based position in the source's list after invalid items were dropped. */
  rank: number;
  /** Grouping keys, strongest first: doi:, arxiv:, then url:. */
  keys: string[];
  /** Language (ISO 639-1) and country (ISO 3166-1 alpha-2) the source states for this result, for the filters' check. */
  language?: string;
  country?: string;
}

/** One source's contribution to a fusion. */
export interface RankedList {
  source: string;
  /** Fusion weight w_s. */
  weight: number;
  /** Catalog position, the third tie-break. */
  order: number;
  items: NormalizedItem[];
}

export type FusedResult = MessageInitShape<typeof ResultSchema>;

const NAMED_ENTITIES: Record<string, string> = {
  amp: "&", lt: "<", gt: ">", quot: '"', apos: "'", nbsp: " ", hellip: "…", mdash: "—", ndash: "–",
  lsquo: "‘", rsquo: "’", ldquo: "“", rdquo: "”", laquo: "«", raquo: "»", middot: "·", bull: "•",
  copy: "©", reg: "®", trade: "™", deg: "°", times: "×", euro: "€", pound: "£", eacute: "é", egrave: "è",
  aacute: "á", agrave: "à", iacute: "í", oacute: "ó", uacute: "ú", ntilde: "ñ", uuml: "ü", ouml: "ö",
  auml: "ä", ccedil: "ç", szlig: "ß", shy: "",
};

/** Decodes HTML/XML character references; unknown named entities stay as written. */
export function decodeEntities(text: string): string {
  return text.replace(/&(#\d{1,7}|#[xX][0-9a-fA-F]{1,6}|[a-zA-Z][a-zA-Z0-9]{1,31});/g, (whole, body: string) => {
    if (body[0] === "#") {
      const code = body[1] === "x" || body[1] === "X" ? parseInt(body.slice(2), 16) : parseInt(body.slice(1), 10);
      return code > 0 && code <= 0x10ffff && !(code >= 0xd800 && code <= 0xdfff) ? String.fromCodePoint(code) : "\uFFFD";
    }
    return NAMED_ENTITIES[body] ?? whole;
  });
}

/**
 * Text for display: tags removed, entities decoded once, whitespace collapsed.
 * A tag must start with a letter or "/", so "a < b" in a plain-text title survives.
 */
export function cleanText(text: string, max: number): string {
  const stripped = text
    .replace(/<!--[\s\S]*?-->/g, " ")
    // Block boundaries separate words ("worth it<p>in 2024" must not glue); inline tags do not.
    .replace(/<\/?(p|br|div|li|ul|ol|pre|blockquote|h[1-6]|tr|td|th)(\s[^<>]*)?\/?>/gi, " ")
    .replace(/<\/?[a-zA-Z][^<>]*>/g, "");
  const decoded = decodeEntities(stripped).replace(/[\u0000-\u0008\u000B-\u001F\u007F]/g, "");
  const collapsed = decoded.replace(/\s+/g, " ").trim();
  const points = [...collapsed];
  return points.length <= max ? collapsed : points.slice(0, max - 1).join("").trimEnd() + "…";
}

/** An absolute http(s) URL without credentials and within 2048 characters, or null. */
export function cleanUrl(raw: string): URL | null {
  let url: URL;
  try {
    url = new URL(raw.trim());
  } catch {
    return null;
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return null;
  if (url.username !== "" || url.password !== "") return null;
  if (url.href.length > URL_MAX) return null;
  return url;
}

/**
 * ISO-8601 UTC without milliseconds, or null when absent or not a real time
 * (unparseable, out of Date's range, or a calendar day that does not exist
 * such as 2026-02-30, which Date.parse would roll into March).
 */
export function cleanDate(raw: string | null): string | null {
  if (typeof raw !== "string" || raw.trim() === "") return null;
  const text = raw.trim();
  const day = /^(\d{4})-(\d\d)-(\d\d)/.exec(text);
  if (day && !isCalendarDay(Number(day[1]), Number(day[2]), Number(day[3]))) return null;
  // An ISO date-time without a zone is UTC here (Brave's page_age); Date.parse would read it as local time.
  const ms = Date.parse(/^\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d(\.\d+)?)?$/.test(text) ? `${text}Z` : text);
  if (Number.isNaN(ms)) return null;
  return new Date(ms).toISOString().replace(".000Z", "Z");
}

function isCalendarDay(year: number, month: number, day: number): boolean {
  const date = new Date(Date.UTC(year, month - 1, day));
  return date.getUTCMonth() === month - 1 && date.getUTCDate() === day;
}

const TRACKING = /^(utm_.*|gclid|fbclid|mc_cid|mc_eid)$/i;

/**
 * Grouping key only: scheme-blind, host lowercased without "www." or default
 * port, no fragment, no trailing slash (except the root), no tracking
 * parameters, query sorted. Never shown: it can address another resource.
 */
export function urlKey(url: URL): string {
  let host = url.hostname.toLowerCase().replace(/^www\./, "");
  const defaultPort = url.port === "" || (url.protocol === "http:" && url.port === "80") || (url.protocol === "https:" && url.port === "443");
  if (!defaultPort) host += `:${url.port}`;
  let path = canonicalEscapes(url.pathname);
  if (path.length > 1) path = path.replace(/\/+$/, "");
  const params = [...url.searchParams.entries()]
    .filter(([name]) => !TRACKING.test(name))
    .sort(([a, av], [b, bv]) => (a < b ? -1 : a > b ? 1 : av < bv ? -1 : av > bv ? 1 : 0));
  const query = params.length > 0 ? "?" + new URLSearchParams(params).toString() : "";
  return `url:${host}${path || "/"}${query}`;
}

/**
 * One spelling of a path's escapes: %XX of a character RFC 3986 allows
 * literally in a path segment (unreserved, sub-delims, ":" and "@") is
 * decoded, because sites treat both forms as one page and sources disagree
 * (MediaWiki's wfUrlencode writes "Washington,_D.C." and "%27", encodeURIComponent
 * "%2C" and "'"); every other escape keeps its meaning, in upper-case hex.
 */
export function canonicalEscapes(path: string): string {
  return path.replace(/%([0-9a-fA-F]{2})/g, (_, hex: string) => {
    const char = String.fromCharCode(parseInt(hex, 16));
    return /[A-Za-z0-9\-._~!$&'()*+,;=:@]/.test(char) ? char : `%${hex.toUpperCase()}`;
  });
}

const DOI = /^10\.\d{4,9}\/\S+$/;
const ARXIV_NEW = /^(\d{4}\.\d{4,5})(v\d+)?$/;
const ARXIV_OLD = /^([a-z-]+(?:\.[A-Z]{2})?\/\d{7})(v\d+)?$/;

/** A lowercased DOI from metadata or a doi.org URL path, or undefined. */
export function doiOf(raw: string | undefined, url: URL): string | undefined {
  const candidates = [raw ?? ""];
  const host = url.hostname.toLowerCase();
  if (host === "doi.org" || host === "dx.doi.org") candidates.push(safeDecode(url.pathname.slice(1)));
  for (const candidate of candidates) {
    const doi = candidate.trim().replace(/^(https?:\/\/(dx\.)?doi\.org\/|doi:)/i, "").toLowerCase();
    if (DOI.test(doi)) return doi;
  }
  return undefined;
}

/** An arXiv id without its version, from metadata or an arxiv.org abs/pdf URL. */
export function arxivIdOf(raw: string | undefined, url: URL): string | undefined {
  const candidates = [raw ?? ""];
  const host = url.hostname.toLowerCase().replace(/^(www|export)\./, "");
  if (host === "arxiv.org") {
    const match = /^\/(?:abs|pdf)\/(.+?)(?:\.pdf)?$/.exec(url.pathname);
    if (match) candidates.push(match[1]!);
  }
  for (const candidate of candidates) {
    const id = candidate.trim().replace(/^arxiv:/i, "");
    const match = ARXIV_NEW.exec(id) ?? ARXIV_OLD.exec(id);
    if (match) return match[1];
  }
  return undefined;
}

function safeDecode(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

/**
 * Cleans one source's list. Items without a usable http(s) URL or a title are
 * dropped (one odd item never fails the list), and ranks count only the survivors.
 */
export function normalizeItems(items: RawItem[]): NormalizedItem[] {
  const out: NormalizedItem[] = [];
  for (const item of items) {
    const url = cleanUrl(item.url);
    if (!url) continue;
    const title = cleanText(item.title, TITLE_MAX);
    if (title === "") continue;
    const keys: string[] = [];
    const doi = doiOf(item.doi, url);
    if (doi) keys.push(`doi:${doi}`);
    const arxiv = arxivIdOf(item.arxivId, url);
    if (arxiv) keys.push(`arxiv:${arxiv}`);
    keys.push(urlKey(url));
    const discussion = item.discussionUrl ? cleanUrl(item.discussionUrl) : null;
    out.push({
      title,
      url: url.href,
      snippet: cleanText(item.snippet, SNIPPET_MAX),
      generatedSnippet: item.generatedSnippet === true,
      discussionUrl: discussion && discussion.href !== url.href ? discussion.href : undefined,
      publishedAt: cleanDate(item.publishedAt),
      rank: out.length + 1,
      keys,
      ...(item.language !== undefined ? { language: item.language } : {}),
      ...(item.country !== undefined ? { country: item.country } : {}),
    });
  }
  return out;
}

/**
 * The exact window: drops items published before the cutoff. Null-dated items
 * stay, because only sources that filtered on the server are queried under a window.
 */
export function postFilter(items: NormalizedItem[], cutoffMs: number | undefined): NormalizedItem[] {
  if (cutoffMs === undefined) return items;
  return items.filter((item) => item.publishedAt === null || Date.parse(item.publishedAt) >= cutoffMs);
}

interface Member {
  item: NormalizedItem;
  list: RankedList;
}

/**
 * Weighted RRF: score(d) = Σ_s w_s / (60 + best rank of d in s). Items sharing
 * any key (DOI, arXiv id or URL key) form one group, so a paper found by DOI in
 * one source and by arXiv URL in another merges. Same-source repeats add one
 * term, at their best rank, never one term each.
 */
export function fuse(lists: RankedList[], limit = MAX_RESULTS): FusedResult[] {
  const members: Member[] = [];
  for (const list of lists) for (const item of list.items) members.push({ item, list });

  const parent = members.map((_, i) => i);
  const find = (i: number): number => {
    while (parent[i] !== i) {
      parent[i] = parent[parent[i]!]!;
      i = parent[i]!;
    }
    return i;
  };
  const owner = new Map<string, number>();
  members.forEach((member, i) => {
    for (const key of member.item.keys) {
      const j = owner.get(key);
      if (j === undefined) owner.set(key, i);
      else {
        const a = find(i), b = find(j);
        if (a !== b) parent[Math.max(a, b)] = Math.min(a, b);
      }
    }
  });

  const groups = new Map<number, Member[]>();
  members.forEach((member, i) => {
    const root = find(i);
    const group = groups.get(root);
    if (group) group.push(member);
    else groups.set(root, [member]);
  });

  const fused = [...groups.values()].map((group) => {
    const ranked = [...group].sort((a, b) => a.item.rank - b.item.rank || a.list.order - b.list.order);
    const best = ranked[0]!;
    const perSource = new Map<RankedList, number>();
    for (const m of ranked) if (!perSource.has(m.list)) perSource.set(m.list, m.item.rank);
    const inOrder = [...perSource.entries()].sort(([a], [b]) => a.order - b.order);
    const score = inOrder.reduce((sum, [list, rank]) => sum + list.weight / (RRF_K + rank), 0);
    const key = [...best.item.keys].sort()[0]!;
    return {
      score,
      bestRank: best.item.rank,
      sourceCount: inOrder.length,
      bestOrder: best.list.order,
      key,
      result: {
        title: ranked.find((m) => m.item.title !== "")?.item.title ?? "",
        url: displayUrl(best.item, ranked),
        snippet: chooseSnippet(ranked.map((m) => m.item)),
        discussionUrl: ranked.find((m) => m.item.discussionUrl !== undefined)?.item.discussionUrl,
        publishedAt: ranked.find((m) => m.item.publishedAt !== null)?.item.publishedAt ?? undefined,
        score,
        foundIn: inOrder.map(([list, rank]) => ({ source: list.source, rank })),
      } satisfies FusedResult,
    };
  });

  fused.sort(
    (a, b) =>
      b.score - a.score ||
      a.bestRank - b.bestRank ||
      b.sourceCount - a.sourceCount ||
      a.bestOrder - b.bestOrder ||
      (a.key < b.key ? -1 : a.key > b.key ? 1 : 0),
  );
  return fused.slice(0, limit).map((f) => f.result);
}

/**
 * A provider's own description beats a snippet we made up from facts
 * ("2280 points · 311 comments"), however long; among equals the longest wins.
 */
export function chooseSnippet(items: Pick<NormalizedItem, "snippet" | "generatedSnippet">[]): string {
  let best: Pick<NormalizedItem, "snippet" | "generatedSnippet"> | undefined;
  for (const item of items) {
    if (item.snippet === "") continue;
    if (
      !best ||
      (best.generatedSnippet && !item.generatedSnippet) ||
      (best.generatedSnippet === item.generatedSnippet && [...item.snippet].length > [...best.snippet].length)
    ) best = item;
  }
  return best?.snippet ?? "";
}

/** The best member's own URL, upgraded to https when an https copy of the same address was seen. */
function displayUrl(best: NormalizedItem, group: Member[]): string {
  if (!best.url.startsWith("http:")) return best.url;
  const key = urlKey(new URL(best.url));
  const https = group.find((m) => m.item.url.startsWith("https:") && urlKey(new URL(m.item.url)) === key);
  if (!https) return best.url;
  const upgraded = new URL(best.url);
  upgraded.protocol = "https:";
  if (upgraded.port === "80") upgraded.port = "";
  return upgraded.href;
}
