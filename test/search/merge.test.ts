import { describe, expect, it } from "vitest";
import {
  arxivIdOf, cleanDate, cleanText, cleanUrl, decodeEntities, doiOf, fuse, normalizeItems, postFilter, urlKey,
  type RankedList,
} from "../../src/search/merge.js";
import type { RawItem } from "../../src/search/sources/types.js";

describe("normalization", () => {
  it.each([
    ["tags stripped", "<b>Rust</b> <span class=\"searchmatch\">async</span>", "Rust async"],
    ["entities decoded once", "Tom &amp;amp; Jerry &quot;q&quot; &#39;s&#x27;", "Tom &amp; Jerry \"q\" 's'"],
    ["tags then entities: an escaped tag is text", "&lt;div&gt; in React", "<div> in React"],
    ["a bare < survives", "a < b and c>d", "a < b and c>d"],
    ["whitespace collapsed", "  line\n\t two  ", "line two"],
    ["control characters dropped", "bell\u0007 here", "bell here"],
    ["comments dropped", "a<!-- hidden -->b", "a b"],
    ["unknown entity kept", "&bogus; &nbsp;x", "&bogus; x"],
  ])("cleanText: %s", (_name, input, expected) => {
    expect(cleanText(input, 300)).toBe(expected);
  });

  it("cleanText caps by code points with an ellipsis", () => {
    expect(cleanText("🙂".repeat(10), 5)).toBe("🙂🙂🙂🙂…");
  });

  it.each([
    ["&#128578;", "🙂"],
    ["&#xD800;", "\uFFFD"],
    ["&mdash;&hellip;", "—…"],
  ])("decodeEntities(%s)", (input, expected) => {
    expect(decodeEntities(input)).toBe(expected);
  });

  it.each([
    ["https://example.com/a b", "https://example.com/a%20b"],
    ["http://example.com", "http://example.com/"],
    ["ftp://example.com/file", null],
    ["javascript:alert(1)", null],
    ["/relative/path", null],
    ["https://user:pw@example.com/", null],
    [`https://example.com/${"a".repeat(2100)}`, null],
    ["", null],
  ])("cleanUrl(%s) → %s", (input, expected) => {
    expect(cleanUrl(input)?.href ?? null).toBe(expected);
  });

  it.each([
    ["2026-11-20T08:15:00", "2026-11-20T08:15:00Z"],
    ["2026-11-20T08:15:00.123Z", "2026-11-20T08:15:00.123Z"],
    ["2026-11-20T10:15:00+02:00", "2026-11-20T08:15:00Z"],
    ["2026-11-20", "2026-11-20T00:00:00Z"],
    ["2 days ago", null],
    ["", null],
    [null, null],
  ])("cleanDate(%s) → %s", (input, expected) => {
    expect(cleanDate(input)).toBe(expected);
  });
});

describe("canonical keys", () => {
  it.each([
    ["scheme-blind", "http://example.com/a", "https://example.com/a"],
    ["www. dropped", "https://www.example.com/a", "https://example.com/a"],
    ["host case", "https://EXAMPLE.com/a", "https://example.com/a"],
    ["default port dropped", "https://example.com:443/a", "https://example.com/a"],
    ["fragment dropped", "https://example.com/a#section", "https://example.com/a"],
    ["trailing slash dropped", "https://example.com/a/", "https://example.com/a"],
    ["tracking parameters dropped", "https://example.com/a?utm_source=x&gclid=1&fbclid=2&mc_cid=3&mc_eid=4", "https://example.com/a"],
    ["query sorted", "https://example.com/a?b=2&a=1", "https://example.com/a?a=1&b=2"],
  ])("same key: %s", (_name, a, b) => {
    expect(urlKey(new URL(a))).toBe(urlKey(new URL(b)));
  });

  it.each([
    ["path case kept", "https://example.com/A", "https://example.com/a"],
    ["other port kept", "https://example.com:8443/a", "https://example.com/a"],
    ["real parameters kept", "https://example.com/watch?v=1", "https://example.com/watch?v=2"],
    ["subdomain kept", "https://docs.example.com/a", "https://example.com/a"],
  ])("different key: %s", (_name, a, b) => {
    expect(urlKey(new URL(a))).not.toBe(urlKey(new URL(b)));
  });

  it("the root keeps its slash", () => {
    expect(urlKey(new URL("https://www.example.com"))).toBe("url:example.com/");
  });

  it.each([
    ["metadata", "10.1000/XYZ.123", "https://example.com/", "10.1000/xyz.123"],
    ["doi: prefix", "doi:10.1000/abc", "https://example.com/", "10.1000/abc"],
    ["doi.org URL", undefined, "https://doi.org/10.1000/ABC", "10.1000/abc"],
    ["dx.doi.org URL, encoded", undefined, "https://dx.doi.org/10.1000%2Fabc", "10.1000/abc"],
    ["not a DOI", "hello", "https://example.com/", undefined],
  ])("doiOf: %s", (_name, raw, url, expected) => {
    expect(doiOf(raw, new URL(url))).toBe(expected);
  });

  it.each([
    ["metadata with version", "2301.00001v3", "https://example.com/", "2301.00001"],
    ["abs URL", undefined, "https://arxiv.org/abs/1706.03762v7", "1706.03762"],
    ["pdf URL", undefined, "http://export.arxiv.org/pdf/1706.03762v1.pdf", "1706.03762"],
    ["old-style id", undefined, "https://arxiv.org/abs/hep-th/9901001v2", "hep-th/9901001"],
    ["not arXiv", undefined, "https://example.com/abs/1706.03762", undefined],
  ])("arxivIdOf: %s", (_name, raw, url, expected) => {
    expect(arxivIdOf(raw, new URL(url))).toBe(expected);
  });
});

const raw = (url: string, init: Partial<RawItem> = {}): RawItem => ({ title: url, url, snippet: "", publishedAt: null, ...init });
const list = (source: string, order: number, items: RawItem[], weight = 1): RankedList => ({ source, order, weight, items: normalizeItems(items) });

describe("normalizeItems", () => {
  it("drops invalid URLs and ranks only the survivors", () => {
    const items = normalizeItems([raw("https://a.example/"), raw("not a url"), raw("https://b.example/")]);
    expect(items.map((i) => [i.url, i.rank])).toEqual([["https://a.example/", 1], ["https://b.example/", 2]]);
  });
});

describe("window post-filter", () => {
  const cutoff = Date.parse("2026-11-22T00:00:00Z");
  it.each([
    ["after the cutoff", "2026-11-22T00:00:01Z", true],
    ["at the cutoff", "2026-11-22T00:00:00Z", true],
    ["before the cutoff", "2026-11-21T23:59:59Z", false],
    ["no date (the source filtered on the server)", null, true],
  ])("%s → kept=%s", (_name, date, kept) => {
    const items = normalizeItems([raw("https://a.example/", { publishedAt: date })]);
    expect(postFilter(items, cutoff)).toHaveLength(kept ? 1 : 0);
  });

  it("w=any keeps everything", () => {
    const items = normalizeItems([raw("https://a.example/", { publishedAt: "1990-01-01T00:00:00Z" })]);
    expect(postFilter(items, undefined)).toEqual(items);
  });
});

describe("fusion", () => {
  const urls = (results: ReturnType<typeof fuse>) => results.map((r) => r.url);

  it.each([
    {
      name: "cross-source duplicates merge and add one term per source",
      lists: [list("brave", 0, [raw("https://www.example.com/a?utm_source=x"), raw("https://b.example/")]), list("exa", 1, [raw("http://example.com/a/")])],
      expected: [
        { url: "https://www.example.com/a?utm_source=x", foundIn: [{ source: "brave", rank: 1 }, { source: "exa", rank: 1 }], score: 2 / 61 },
        { url: "https://b.example/", foundIn: [{ source: "brave", rank: 2 }], score: 1 / 62 },
      ],
    },
    {
      name: "same-source duplicates count once, at their best rank",
      lists: [list("brave", 0, [raw("https://x.example/"), raw("https://a.example/p"), raw("http://www.a.example/p/")])],
      expected: [{ url: "https://x.example/", score: 1 / 61 }, { url: "https://a.example/p", foundIn: [{ source: "brave", rank: 2 }], score: 1 / 62 }],
    },
    {
      name: "a paper merges across sources by DOI and arXiv id",
      lists: [
        list("exa", 1, [raw("https://doi.org/10.48550/arXiv.1706.03762")]),
        list("arxiv", 6, [raw("https://arxiv.org/abs/1706.03762", { doi: "10.48550/arXiv.1706.03762", arxivId: "1706.03762" })]),
        list("brave", 0, [raw("https://x.example/"), raw("https://arxiv.org/pdf/1706.03762v2.pdf")]),
      ],
      expected: [
        { url: "https://doi.org/10.48550/arXiv.1706.03762", foundIn: [{ source: "brave", rank: 2 }, { source: "exa", rank: 1 }, { source: "arxiv", rank: 1 }] },
        { url: "https://x.example/" },
      ],
    },
    {
      name: "weights scale a source's terms",
      lists: [list("brave", 0, [raw("https://a.example/")], 1), list("exa", 1, [raw("https://b.example/")], 2)],
      expected: [{ url: "https://b.example/", score: 2 / 61 }, { url: "https://a.example/", score: 1 / 61 }],
    },
    {
      name: "equal scores: catalog order of the best source breaks the tie",
      lists: [list("exa", 1, [raw("https://b.example/")]), list("brave", 0, [raw("https://a.example/")])],
      expected: [{ url: "https://a.example/" }, { url: "https://b.example/" }],
    },
    {
      name: "the https copy of the best-ranked URL is shown when both were seen",
      lists: [list("brave", 0, [raw("http://example.com/a")]), list("exa", 1, [raw("x"), raw("https://www.example.com/a")])],
      expected: [{ url: "https://example.com/a" }],
    },
  ])("$name", ({ lists, expected }) => {
    const results = fuse(lists);
    expect(results).toHaveLength(expected.length);
    expected.forEach((want, i) => expect(results[i]).toMatchObject(want));
  });

  it("merged fields: best-ranked title, longest snippet, best-ranked date that exists", () => {
    const results = fuse([
      list("brave", 0, [raw("https://a.example/", { title: "Brave title", snippet: "short", publishedAt: null })]),
      list("exa", 1, [raw("x"), raw("https://a.example", { title: "Exa title", snippet: "the longest snippet", publishedAt: "2026-01-01T00:00:00Z" })]),
    ]);
    expect(results[0]).toMatchObject({ title: "Brave title", snippet: "the longest snippet", publishedAt: "2026-01-01T00:00:00Z" });
  });

  it("is deterministic: any input order gives the same output", () => {
    const lists = [
      list("brave", 0, [raw("https://a.example/"), raw("https://b.example/"), raw("https://c.example/")]),
      list("exa", 1, [raw("https://c.example/"), raw("https://d.example/")]),
      list("hackernews", 3, [raw("https://d.example/"), raw("https://a.example/")]),
    ];
    const expected = urls(fuse(lists));
    // a and d tie on score, best rank and source count: a's best source comes first in the catalog.
    expect(expected).toEqual(["https://a.example/", "https://d.example/", "https://c.example/", "https://b.example/"]);
    expect(urls(fuse([...lists].reverse()))).toEqual(expected);
    expect(urls(fuse([lists[1]!, lists[2]!, lists[0]!]))).toEqual(expected);
  });

  it("returns at most 50 results", () => {
    const many = Array.from({ length: 80 }, (_, i) => raw(`https://e${i}.example/`));
    expect(fuse([list("brave", 0, many)])).toHaveLength(50);
  });
});
