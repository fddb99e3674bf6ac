import { create } from "@bufbuild/protobuf";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { SearchRequestSchema } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { hostCovered, hostOfUrl, readDomain } from "../../src/search/domains.js";
import { applyFilters, completePlan, filtersKey, readFilters, validateFilters, type FilterPlan } from "../../src/search/filters.js";
import { normalizeItems } from "../../src/search/merge.js";
import { validateSearchRequest } from "../../src/search/validate.js";

/** The filters' request rules, domain matching and typesafe's own check, as pure functions. */

const request = (init: { d?: string[]; xd?: string[]; l?: string; c?: string; safe?: string }) => create(SearchRequestSchema, { q: "rust", ...init });
const violations = (init: Parameters<typeof request>[0], minSafe?: "off" | "moderate" | "strict") => validateFilters(request(init), minSafe);

describe("domain entries", () => {
  it.each([
    ["example.com"],
    ["docs.example.com"],
    ["EXAMPLE.com"],
    ["example.co.uk"],
    ["*.example.com"],
    ["user.github.io"],
    // A private suffix of the list names a platform a caller may keep or drop whole.
    ["github.io"],
    ["bücher.de"],
    ["xn--bcher-kva.de"],
  ])("%s is accepted", (entry) => {
    expect(violations({ d: [entry] })).toEqual([]);
  });

  it.each([
    ["com", 'd[0]', '"com" is a public suffix ("com"), which names no site: give a domain under it'],
    ["co.uk", 'd[0]', '"co.uk" is a public suffix ("co.uk"), which names no site: give a domain under it'],
    ["*.co.uk", 'd[0]', '"*.co.uk" is a public suffix ("co.uk"), which names no site: give a domain under it'],
    ["localhost", 'd[0]', '"localhost" is a public suffix ("localhost"), which names no site: give a domain under it'],
    ["https://example.com", 'd[0]', '"https://example.com" must be a domain name, not a URL (no scheme)'],
    ["example.com/blog", 'd[0]', '"example.com/blog" must be a domain name without a path'],
    ["example.com:8080", 'd[0]', '"example.com:8080" must be a domain name without a port'],
    ["ex*ample.com", 'd[0]', '"ex*ample.com" may hold a wildcard only as a leading "*." (as in "*.example.com")'],
    ["example.*", 'd[0]', '"example.*" may hold a wildcard only as a leading "*." (as in "*.example.com")'],
    ["*example.com", 'd[0]', '"*example.com" may hold a wildcard only as a leading "*." (as in "*.example.com")'],
    ["*.*.example.com", 'd[0]', '"*.*.example.com" may hold a wildcard only as a leading "*." (as in "*.example.com")'],
    ["192.168.1.10", 'd[0]', '"192.168.1.10" must be a domain name, not an IP address'],
    ["user@example.com", 'd[0]', '"user@example.com" must be a domain name, not an address with a user'],
    ["exa mple.com", 'd[0]', '"exa mple.com" is not a valid domain name'],
    ["example.com.", 'd[0]', '"example.com." is not a valid domain name'],
    ["-bad-.com", 'd[0]', '"-bad-.com" is not a valid domain name'],
    ["", 'd[0]', '"" must be a domain name, not empty'],
  ])("%j is refused naming the field, the entry and the rule", (entry, field, rule) => {
    expect(violations({ d: [entry] })).toEqual([{ field, rule }]);
    expect(violations({ xd: ["ok.example", entry] })[0]).toEqual({ field: field.replace("d[0]", "xd[1]"), rule });
  });

  it("at most 20 per list; twice in one list; in both lists; a kept domain inside a dropped one", () => {
    const many = Array.from({ length: 21 }, (_, i) => `site${i}.example`);
    expect(violations({ d: many })).toEqual([{ field: "d", rule: "must list at most 20 domains, got 21" }]);
    expect(violations({ xd: many.slice(0, 20) })).toEqual([]);
    expect(violations({ d: ["example.com", "Example.COM"] })).toEqual([{ field: "d[1]", rule: '"Example.COM" is listed twice' }]);
    expect(violations({ d: ["a.example", "example.com"], xd: ["example.com"] })).toEqual([
      { field: "xd[0]", rule: '"example.com" is also in d; a domain cannot be both kept and dropped' },
    ]);
    expect(violations({ d: ["blog.example.com"], xd: ["example.com"] })).toEqual([
      { field: "d[0]", rule: '"blog.example.com" lies inside "example.com" of xd, so nothing it keeps could be returned' },
    ]);
    // Keeping a site but dropping one of its parts is meaningful.
    expect(violations({ d: ["example.com"], xd: ["blog.example.com"] })).toEqual([]);
    expect(violations({ d: ["example.com"], xd: ["*.example.com"] })).toEqual([]);
  });
});

describe("codes and safe search", () => {
  it.each([
    [{ l: "de" }, []],
    [{ l: "DE" }, [{ field: "l", rule: 'must be an ISO 639-1 language code in lower case, such as "en", got "DE"' }]],
    [{ l: "xx" }, [{ field: "l", rule: 'must be an ISO 639-1 language code in lower case, such as "en", got "xx"' }]],
    [{ l: "deu" }, [{ field: "l", rule: 'must be an ISO 639-1 language code in lower case, such as "en", got "deu"' }]],
    [{ l: "en-US" }, [{ field: "l", rule: 'must be an ISO 639-1 language code in lower case, such as "en", got "en-US"' }]],
    [{ c: "GB" }, []],
    [{ c: "gb" }, [{ field: "c", rule: 'must be an ISO 3166-1 alpha-2 country code in upper case, such as "DE", got "gb"' }]],
    [{ c: "UK" }, [{ field: "c", rule: 'must be an ISO 3166-1 alpha-2 country code in upper case, such as "DE", got "UK"' }]],
    [{ c: "ZZ" }, [{ field: "c", rule: 'must be an ISO 3166-1 alpha-2 country code in upper case, such as "DE", got "ZZ"' }]],
    [{ c: "USA" }, [{ field: "c", rule: 'must be an ISO 3166-1 alpha-2 country code in upper case, such as "DE", got "USA"' }]],
    [{ safe: "strict" }, []],
    [{ safe: "high" }, [{ field: "safe", rule: "must be one of off, moderate, strict" }]],
    [{ safe: "Strict" }, [{ field: "safe", rule: "must be one of off, moderate, strict" }]],
  ])("%j → %j", (init, expected) => {
    expect(violations(init)).toEqual(expected);
  });

  it("the operator's minimum: below it is refused, omitted takes it, at or above passes", () => {
    expect(violations({ safe: "off" }, "moderate")).toEqual([{ field: "safe", rule: 'must be at least "moderate" on this deployment' }]);
    expect(violations({ safe: "moderate" }, "strict")).toEqual([{ field: "safe", rule: 'must be at least "strict" on this deployment' }]);
    expect(violations({ safe: "strict" }, "moderate")).toEqual([]);
    expect(readFilters(request({}), "moderate").safe).toBe("moderate");
    expect(readFilters(request({}), "off").safe).toBeUndefined();
  });

  it("mixes: every broken rule is listed, the 400 names the first", () => {
    const all = validateSearchRequest(request({ d: ["com"], xd: ["https://x.example"], l: "english", c: "us", safe: "max" }));
    expect(all.map((v) => v.field)).toEqual(["d[0]", "xd[0]", "l", "c", "safe"]);
  });
});

describe("matching a result host", () => {
  const covered = (host: string, entry: string) => hostCovered(hostOfUrl(`https://${host}/`), readDomain(entry)!);
  it.each([
    ["example.com", "example.com", true],
    ["docs.example.com", "example.com", true],
    ["a.b.example.com", "example.com", true],
    ["notexample.com", "example.com", false],
    ["example.com.evil.net", "example.com", false],
    ["example.org", "example.com", false],
    ["example.com", "*.example.com", false],
    ["docs.example.com", "*.example.com", true],
    ["xn--bcher-kva.de", "bücher.de", true],
    ["EXAMPLE.com", "example.com", true],
    ["example.com.", "example.com", true],
    ["xample.com", "example.com", false],
  ])("%s under %s: %s", (host, entry, expected) => {
    expect(covered(host, entry)).toBe(expected);
  });

  it("the cache text of the filters ignores order and case, and is empty without filters", () => {
    const a = readFilters(request({ d: ["b.example", "A.example"], l: "de" }));
    const b = readFilters(request({ d: ["a.example", "b.example"], l: "de" }));
    expect(filtersKey(a)).toBe(filtersKey(b));
    expect(filtersKey(readFilters(request({})))).toBe("");
    expect(filtersKey(a)).not.toBe(filtersKey(readFilters(request({ d: ["a.example", "b.example"], l: "fr" }))));
  });
});

describe("typesafe's own check", () => {
  const items = (urls: string[], extra: { language?: string; discussionUrl?: string } = {}) =>
    normalizeItems(urls.map((url) => ({ title: url, url, snippet: "", publishedAt: null, ...extra })));
  const plan = (filters: ReturnType<typeof readFilters>, applied: FilterPlan["applied"] = {}) => completePlan(filters, { applied });

  it("drops excluded hosts and hosts outside the include list, counting each under the filter it failed", () => {
    const filters = readFilters(request({ d: ["example.com", "news.example.org"], xd: ["ads.example.com"] }));
    const { kept, dropped } = applyFilters(
      items(["https://example.com/a", "https://ads.example.com/x", "https://notexample.com/", "https://news.example.org/1", "https://example.org/2"]),
      filters,
      plan(filters),
    );
    expect(kept.map((i) => i.url)).toEqual(["https://example.com/a", "https://news.example.org/1"]);
    expect(dropped).toEqual({ d: 2, xd: 1 });
  });

  it("language: a stated other language is dropped; an unstated one is kept only when the provider filtered natively", () => {
    const filters = readFilters(request({ l: "de" }));
    const list = [...items(["https://a.example/1"], { language: "de" }), ...items(["https://b.example/2"], { language: "en" }), ...items(["https://c.example/3"])];
    expect(applyFilters(list, filters, plan(filters, { l: "post_filtered" })).kept.map((i) => i.url)).toEqual(["https://a.example/1"]);
    expect(applyFilters(list, filters, plan(filters, { l: "native" })).kept.map((i) => i.url)).toEqual(["https://a.example/1", "https://c.example/3"]);
    expect(applyFilters(list, filters, plan(filters, { l: "unsupported" })).kept).toHaveLength(3);
  });

  it("a discussion link on a dropped host is removed, the result stays", () => {
    const filters = readFilters(request({ xd: ["ycombinator.com"] }));
    const { kept } = applyFilters(items(["https://a.example/post"], { discussionUrl: "https://news.ycombinator.com/item?id=1" }), filters, plan(filters));
    expect(kept.map((i) => [i.url, i.discussionUrl])).toEqual([["https://a.example/post", undefined]]);
  });

  it("no filters: the list comes back as it is", () => {
    const list = items(["https://a.example/1"]);
    const filters = readFilters(request({}));
    expect(applyFilters(list, filters, plan(filters)).kept).toBe(list);
  });
});

describe("property: nothing excluded, nothing outside an include list, ever returned", () => {
  const label = fc.constantFrom("a", "b", "c", "ex", "news", "www", "docs", "example", "exampleb", "notexample");
  const tld = fc.constantFrom("com", "org", "co.uk", "io");
  const domain = fc.tuple(fc.array(label, { minLength: 1, maxLength: 2 }), tld).map(([labels, t]) => `${labels.join(".")}.${t}`);
  const host = fc.tuple(fc.array(label, { minLength: 0, maxLength: 3 }), domain).map(([sub, d]) => [...sub, d].join("."));
  const entry = fc.tuple(fc.boolean(), domain).map(([star, d]) => (star ? `*.${d}` : d));

  it("holds for random result sets and random lists", () => {
    fc.assert(
      fc.property(
        fc.array(host, { maxLength: 40 }),
        fc.uniqueArray(entry, { maxLength: 6 }),
        fc.uniqueArray(entry, { maxLength: 6 }),
        fc.constantFrom<FilterPlan["applied"]["d"]>("native", "post_filtered"),
        (hosts, include, exclude, handling) => {
          const req = request({ d: include, xd: exclude });
          fc.pre(validateFilters(req).length === 0);
          const filters = readFilters(req);
          const list = normalizeItems(hosts.map((h, i) => ({ title: `t${i}`, url: `https://${h}/p${i}`, snippet: "", publishedAt: null, discussionUrl: `https://${hosts[(i + 1) % hosts.length]}/d` })));
          const { kept, dropped } = applyFilters(list, filters, completePlan(filters, { applied: { d: handling, xd: handling } }));
          // An independent statement of the rule: dot-aligned suffixes, "*." meaning strictly below.
          const under = (h: string, e: string) => (e.startsWith("*.") ? h.endsWith(e.slice(1)) : h === e || h.endsWith(`.${e}`));
          for (const item of kept) {
            for (const link of [item.url, item.discussionUrl].filter((u): u is string => u !== undefined)) {
              const h = new URL(link).hostname;
              expect(exclude.some((e) => under(h, e))).toBe(false);
              if (include.length > 0) expect(include.some((e) => under(h, e))).toBe(true);
            }
          }
          // Nothing allowed is lost: what was dropped failed a rule.
          const allowed = list.filter((i) => {
            const h = new URL(i.url).hostname;
            return !exclude.some((e) => under(h, e)) && (include.length === 0 || include.some((e) => under(h, e)));
          });
          expect(kept.map((i) => i.url)).toEqual(allowed.map((i) => i.url));
          expect((dropped.d ?? 0) + (dropped.xd ?? 0)).toBe(list.length - kept.length);
        },
      ),
      { numRuns: 500 },
    );
  });
});
