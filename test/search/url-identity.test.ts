import { describe, expect, it } from "vitest";
import { chooseSnippet, cleanDate, fuse, normalizeItems, urlKey, type RankedList } from "../../src/search/merge.js";
import type { RawItem } from "../../src/search/sources/types.js";
import { WIKIPEDIA_ARTICLE_BASE, articlePath } from "../../src/search/sources/wikipedia.js";

/**
 * One identity for a page, whichever source spelled its URL: pairs as the
 * providers really write them (Brave's and MediaWiki's wfUrlencode paths,
 * Exa's http links with tracking tags, Algolia's article URLs).
 */

const key = (url: string) => urlKey(new URL(url));
const item = (url: string, snippet = "", generated = false, extra: Partial<RawItem> = {}): RawItem => ({
  title: "t", url, snippet, generatedSnippet: generated, publishedAt: null, ...extra,
});
const list = (source: string, order: number, items: RawItem[]): RankedList => ({ source, weight: 1, order, items: normalizeItems(items) });

describe("url identity", () => {
  it.each([
    // Wikipedia before the fix wrote encodeURIComponent ("%2C"); Brave shows MediaWiki's own link.
    ["https://en.wikipedia.org/wiki/Washington%2C_D.C.", "https://en.wikipedia.org/wiki/Washington,_D.C."],
    ["https://en.wikipedia.org/wiki/Ender%27s_Game", "https://en.wikipedia.org/wiki/Ender's_Game"],
    // Lower-case hex escapes (some crawlers) against upper-case ones (RFC 3986 §6.2.2.1).
    ["https://en.wikipedia.org/wiki/Caf%c3%a9", "https://en.wikipedia.org/wiki/Caf%C3%A9"],
    // Exa often returns http and tracking tags; Brave the canonical https form with www.
    ["http://example.com/guide/?utm_medium=feed&ref=a", "https://www.Example.com/guide?ref=a"],
    // Host case, default port, fragment.
    ["https://BITBASHING.io:443/async-rust.html#intro", "https://bitbashing.io/async-rust.html"],
  ])("%s ≡ %s", (a, b) => {
    expect(key(a)).toBe(key(b));
  });

  it.each([
    // An encoded "/" is a different path from a real one; "?" in a path stays escaped.
    ["https://example.com/a%2Fb", "https://example.com/a/b"],
    ["https://example.com/q%3Fx", "https://example.com/q?x"],
    ["https://example.com/guide?ref=a", "https://example.com/guide?ref=b"],
  ])("%s ≢ %s", (a, b) => {
    expect(key(a)).not.toBe(key(b));
  });

  it("a Wikipedia hit and Brave's link to the same article fuse into one result", () => {
    const wiki = WIKIPEDIA_ARTICLE_BASE + articlePath("Washington, D.C.");
    const fused = fuse([
      list("brave", 0, [item("https://en.wikipedia.org/wiki/Washington,_D.C.", "Washington, D.C., formally the District of Columbia, is the capital city of the United States.")]),
      list("wikipedia", 2, [item(wiki, "Washington, D.C., formally the District of Columbia")]),
    ]);
    expect(fused).toHaveLength(1);
    expect(fused[0]!.foundIn).toEqual([{ source: "brave", rank: 1 }, { source: "wikipedia", rank: 1 }]);
  });

  it("a Hacker News story fuses with the article Brave found and keeps its discussion link", () => {
    const fused = fuse([
      list("brave", 0, [item("https://www.bitbashing.io/async-rust.html", "Async Rust is a bad language? A critique of async Rust's design.")]),
      list("hackernews", 3, [item("https://bitbashing.io/async-rust.html", "2280 points · 311 comments · by pg · bitbashing.io", true, { discussionUrl: "https://news.ycombinator.com/item?id=37435515" })]),
    ]);
    expect(fused).toHaveLength(1);
    expect(fused[0]).toMatchObject({
      url: "https://www.bitbashing.io/async-rust.html",
      discussionUrl: "https://news.ycombinator.com/item?id=37435515",
      snippet: "Async Rust is a bad language? A critique of async Rust's design.",
    });
  });
});

describe("snippet choice", () => {
  it("a provider's description beats a longer made-up fact string; among equals the longest wins", () => {
    expect(chooseSnippet([
      { snippet: "2280 points · 311 comments · by someone · bitbashing.io", generatedSnippet: true },
      { snippet: "Short real text.", generatedSnippet: false },
    ])).toBe("Short real text.");
    expect(chooseSnippet([
      { snippet: "reuters.com · English", generatedSnippet: true },
      { snippet: "answered · score 12 · 3 answers", generatedSnippet: true },
    ])).toBe("answered · score 12 · 3 answers");
    expect(chooseSnippet([{ snippet: "", generatedSnippet: false }, { snippet: "facts", generatedSnippet: true }])).toBe("facts");
  });
});

describe("the zone-less date rule does not depend on the machine's zone", () => {
  it.each(["Asia/Kolkata", "America/St_Johns", "Pacific/Chatham"])("TZ=%s: Brave's page_age without a zone is UTC", (zone) => {
    const saved = process.env["TZ"];
    process.env["TZ"] = zone;
    try {
      // The zone really changed (Node re-reads TZ on assignment), so a local-time parse would shift.
      expect(new Date(Date.UTC(2026, 10, 23, 5)).getTimezoneOffset()).not.toBe(0);
      expect(cleanDate("2026-11-23T05:00:00")).toBe("2026-11-23T05:00:00Z");
      expect(cleanDate("2026-11-23T05:00")).toBe("2026-11-23T05:00:00Z");
      expect(cleanDate("2026-11-23T05:00:00.250")).toBe("2026-11-23T05:00:00.250Z");
    } finally {
      if (saved === undefined) delete process.env["TZ"];
      else process.env["TZ"] = saved;
    }
  });
});
