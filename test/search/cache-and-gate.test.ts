import { describe, expect, it } from "vitest";
import { ConfigError } from "../../src/config-error.js";
import { cacheKey, createSingleFlight, createTtlCache, normalizeQuery } from "../../src/search/cache.js";
import { createRateGate, FIRST_FAILURE_SUSPENSION_MS, MAX_FAILURE_SUSPENSION_MS } from "../../src/search/rate-gate.js";
import { linkedSignal } from "../../src/abort-signals.js";
import { parseSourceCatalog } from "../../src/search/source-config.js";

/** A clock the test moves by hand: TTLs and budgets are checked without waiting. */
function manualClock(start = Date.parse("2026-11-23T06:00:00.437Z")) {
  let t = start;
  return { now: () => t, advance: (ms: number) => (t += ms) };
}

describe("cache", () => {
  it.each([
    ["  rust\t\n async  ", "rust async"],
    ["Rust Async", "Rust Async"],
    ["e\u0301t\u00e9", "\u00e9t\u00e9"],
  ])("normalizeQuery(%j) → %j", (input, expected) => {
    expect(normalizeQuery(input)).toBe(expected);
  });

  it.each([
    ["source", cacheKey("brave", 1, "q", "any"), cacheKey("exa", 1, "q", "any")],
    ["adapter version", cacheKey("brave", 1, "q", "any"), cacheKey("brave", 2, "q", "any")],
    ["window", cacheKey("brave", 1, "q", "24h"), cacheKey("brave", 1, "q", "7d")],
    ["query", cacheKey("brave", 1, "q", "any"), cacheKey("brave", 1, "Q", "any")],
  ])("the key depends on the %s", (_name, a, b) => {
    expect(a).not.toBe(b);
  });

  it("expires entries at their TTL on the injected clock", () => {
    const clock = manualClock();
    const cache = createTtlCache<string>({ now: clock.now, maxEntries: 10 });
    cache.set("k", "v", 1000);
    clock.advance(999);
    expect(cache.get("k")).toBe("v");
    clock.advance(1);
    expect(cache.get("k")).toBeUndefined();
  });

  it("evicts the oldest write past maxEntries; size 0 disables it", () => {
    const cache = createTtlCache<number>({ now: Date.now, maxEntries: 2 });
    cache.set("a", 1, 60_000);
    cache.set("b", 2, 60_000);
    cache.set("c", 3, 60_000);
    expect([cache.get("a"), cache.get("b"), cache.get("c")]).toEqual([undefined, 2, 3]);
    const off = createTtlCache<number>({ now: Date.now, maxEntries: 0 });
    off.set("a", 1, 60_000);
    expect(off.get("a")).toBeUndefined();
  });

  it("single-flight: concurrent identical calls share one run", async () => {
    const flights = createSingleFlight<number>();
    let runs = 0;
    let release!: (n: number) => void;
    const work = () => {
      runs++;
      return new Promise<number>((resolve) => (release = resolve));
    };
    const a = flights.run("k", new AbortController().signal, work);
    const b = flights.run("k", new AbortController().signal, work);
    await Promise.resolve();
    release(42);
    expect(await Promise.all([a, b])).toEqual([{ value: 42, leader: true }, { value: 42, leader: false }]);
    expect(runs).toBe(1);
    expect(flights.inFlight).toBe(0);
  });

  it("single-flight: one waiter leaving does not cancel the others; the last one does", async () => {
    const flights = createSingleFlight<string>();
    let workSignal!: AbortSignal;
    let release!: (v: string) => void;
    const work = (signal: AbortSignal) => {
      workSignal = signal;
      return new Promise<string>((resolve) => (release = resolve));
    };
    const first = new AbortController();
    const second = new AbortController();
    const a = flights.run("k", first.signal, work);
    const b = flights.run("k", second.signal, work);
    await Promise.resolve();
    first.abort(new Error("gone"));
    await expect(a).rejects.toThrow("gone");
    expect(workSignal.aborted).toBe(false);
    release("done");
    expect((await b).value).toBe("done");

    const c = new AbortController();
    const lone = flights.run("k2", c.signal, work);
    await Promise.resolve();
    c.abort(new Error("bye"));
    await expect(lone).rejects.toThrow("bye");
    expect(workSignal.aborted).toBe(true);
  });
});

describe("rate gate", () => {
  const signal = new AbortController().signal;

  it("spends the budget, then answers rate_limited without waiting when the next token is too late", async () => {
    const clock = manualClock();
    const gate = createRateGate({ limits: { arxiv: { count: 1, intervalMs: 3000, concurrency: 1 } }, now: clock.now });
    const first = await gate.acquire("arxiv", { waitUntilMs: clock.now() + 1000, signal });
    expect(first.granted).toBe(true);
    if (first.granted) first.release();
    expect(await gate.acquire("arxiv", { waitUntilMs: clock.now() + 1000, signal })).toEqual({ granted: false, status: "rate_limited", retryInMs: 3000 });
    clock.advance(3000);
    expect((await gate.acquire("arxiv", { waitUntilMs: clock.now(), signal })).granted).toBe(true);
  });

  it("caps calls in flight; a released slot is usable again", async () => {
    const clock = manualClock();
    const gate = createRateGate({ limits: { gdelt: { count: 100, intervalMs: 1000, concurrency: 1 } }, now: clock.now });
    const held = await gate.acquire("gdelt", { waitUntilMs: clock.now(), signal });
    expect((await gate.acquire("gdelt", { waitUntilMs: clock.now(), signal })).granted).toBe(false);
    if (held.granted) held.release();
    expect((await gate.acquire("gdelt", { waitUntilMs: clock.now(), signal })).granted).toBe(true);
  });

  it("suspension: honours the requested pause, then lifts", async () => {
    const clock = manualClock();
    const gate = createRateGate({ limits: { brave: { count: 10, intervalMs: 1000, concurrency: 10 } }, now: clock.now });
    gate.suspend("brave", 7000);
    expect(gate.suspendedForMs("brave")).toBe(7000);
    expect(await gate.acquire("brave", { waitUntilMs: clock.now() + 1000, signal })).toEqual({ granted: false, status: "suspended", retryInMs: 7000 });
    clock.advance(7000);
    expect(gate.suspendedForMs("brave")).toBe(0);
  });

  it("repeated failures suspend for 5 s, doubling up to 120 s; a success resets the count", () => {
    const clock = manualClock();
    const gate = createRateGate({ limits: { exa: { count: 10, intervalMs: 1000, concurrency: 10 } }, now: clock.now });
    const pauses = Array.from({ length: 9 }, () => {
      const pause = gate.recordFailure("exa");
      clock.advance(pause);
      return pause;
    });
    expect(pauses).toEqual([0, FIRST_FAILURE_SUSPENSION_MS, 10_000, 20_000, 40_000, 80_000, MAX_FAILURE_SUSPENSION_MS, 120_000, 120_000]);
    gate.recordSuccess("exa");
    expect(gate.recordFailure("exa")).toBe(0);
  });

  it("calls failing together while the source is already suspended do not escalate the suspension", () => {
    const clock = manualClock();
    const gate = createRateGate({ limits: { exa: { count: 10, intervalMs: 1000, concurrency: 10 } }, now: clock.now });
    const pauses = Array.from({ length: 10 }, () => gate.recordFailure("exa"));
    expect(pauses).toEqual([0, FIRST_FAILURE_SUSPENSION_MS, 0, 0, 0, 0, 0, 0, 0, 0]);
    expect(gate.suspendedForMs("exa")).toBe(FIRST_FAILURE_SUSPENSION_MS);
  });
});

describe("source catalog", () => {
  it("defaults: keyed sources need their key; defaults and prices as documented", () => {
    const catalog = parseSourceCatalog({});
    expect(catalog.entries.map((e) => [e.id, e.configured, e.isDefault, e.supportsTimeWindow, e.priceUnits])).toEqual([
      ["brave", false, true, true, 6000],
      ["exa", false, true, true, 8000],
      ["wikipedia", true, true, false, 500],
      ["hackernews", true, true, true, 500],
      ["stackoverflow", true, false, true, 500],
      ["github", true, false, true, 500],
      ["arxiv", true, false, true, 500],
      ["gdelt", true, true, true, 500],
    ]);
    expect(catalog.warnings).toContain("brave is not configured: TYPESAFE_SEARCH_BRAVE_KEY is not set");
  });

  it("operator settings override the defaults", () => {
    const catalog = parseSourceCatalog({
      TYPESAFE_SEARCH_SOURCES: "brave,arxiv",
      TYPESAFE_SEARCH_BRAVE_KEY: "k",
      TYPESAFE_SEARCH_BRAVE_URL: "http://127.0.0.1:9/proxy/",
      TYPESAFE_SEARCH_ARXIV_DEFAULT: "true",
      TYPESAFE_SEARCH_ARXIV_PRICE_UNITS: "0",
      TYPESAFE_SEARCH_ARXIV_RATE: "2/6s",
      TYPESAFE_SEARCH_ARXIV_CONCURRENCY: "2",
      TYPESAFE_SEARCH_CONTACT: "ops@example.com",
    });
    const brave = catalog.entries.find((e) => e.id === "brave")!;
    const arxiv = catalog.entries.find((e) => e.id === "arxiv")!;
    expect([brave.configured, brave.baseUrl]).toEqual([true, "http://127.0.0.1:9/proxy"]);
    expect([arxiv.configured, arxiv.isDefault, arxiv.priceUnits, arxiv.rate]).toEqual([true, true, 0, { count: 2, intervalMs: 6000, concurrency: 2 }]);
    expect(catalog.entries.filter((e) => e.configured).map((e) => e.id)).toEqual(["brave", "arxiv"]);
    expect(catalog.userAgent).toBe("typesafe-search/1.0 (+ops@example.com)");
  });

  it("reports every bad value at once", () => {
    let error: unknown;
    try {
      parseSourceCatalog({
        TYPESAFE_SEARCH_SOURCES: "brave,google",
        TYPESAFE_SEARCH_EXA_URL: "ftp://x",
        TYPESAFE_SEARCH_GDELT_RATE: "fast",
        TYPESAFE_SEARCH_GITHUB_DEFAULT: "yes",
      });
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems).toHaveLength(4);
    expect((error as ConfigError).problems[0]).toContain('unknown source ids "google"');
  });
});

describe("linked signals", () => {
  it("a parent's abort propagates with its reason; it is not a timeout", () => {
    const parent = new AbortController();
    const link = linkedSignal([parent.signal], 60_000);
    parent.abort(new Error("caller left"));
    expect([link.signal.aborted, (link.signal.reason as Error).message, link.timedOut()]).toEqual([true, "caller left", false]);
  });

  it("its own timeout aborts it and says so", async () => {
    const link = linkedSignal([], 1);
    await new Promise((resolve) => link.signal.addEventListener("abort", resolve, { once: true }));
    expect(link.timedOut()).toBe(true);
  });

  it("after dispose a parent's abort no longer reaches it", () => {
    const parent = new AbortController();
    const link = linkedSignal([parent.signal], 60_000);
    link.dispose();
    parent.abort();
    expect(link.signal.aborted).toBe(false);
  });

  it("an already aborted parent aborts it at once", () => {
    const link = linkedSignal([AbortSignal.abort("gone")]);
    expect([link.signal.aborted, link.signal.reason]).toEqual([true, "gone"]);
  });
});
