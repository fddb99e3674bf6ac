/**
 * Search through the JSON gateway against the eight fake providers (real
 * HTTP on loopback), with a bare `node:http` server answering the same fixed
 * JSON measured in the same run as the baseline.
 *
 *   npm run bench:search                           # embedded store in a temp folder
 *   DATABASE_URL=postgres://… npm run bench:search   # a scratch database on that server
 *   BENCH_DURATION_S=5 BENCH_CONNECTIONS=50 npm run bench:search
 *
 * Prints req/s, p50/p99 and ratios:
 *   - fan-out latency, one request at a time, every request a cache miss:
 *     eight sources answering after 50–300 ms; it should be the slowest
 *     source's latency plus a few milliseconds;
 *   - the same with one source hung: it is cut at its timeout (1 s here);
 *   - throughput against the bare server: cache misses with providers that
 *     answer at once (our own overhead, eight upstream calls per search), and
 *     cache hits (no upstream call, still metered);
 *   - the same with filters (ten domains to drop, a language, safe search):
 *     every source still called, each result checked, as a ratio to the
 *     unfiltered figure of the same run; and the check alone, in process.
 * Every measure is bounded in time. Accounts get limits far above the
 * product's (60/min, 5 in flight), which would otherwise cap the load.
 * Load generator, fakes and service share this process and the machine's cores.
 */
import { startApp } from "../src/app.js";
import { loadConfig } from "../src/config.js";
import { createLogger } from "../src/logger.js";
import { defaultHandler, FAKE_SOURCE_IDS, startFakeSearch, type FakeSourceId } from "../test/support/fake-search/providers.js";
import { createBenchAccounts, openBenchStore, printTable, runAutocannon, startBareBaseline } from "./support.js";
import { create } from "@bufbuild/protobuf";
import { performance } from "node:perf_hooks";
import { SearchRequestSchema } from "../src/gen/typesafe/search/v1/search_service_pb.js";
import { applyFilters, completePlan, readFilters } from "../src/search/filters.js";
import { normalizeItems } from "../src/search/merge.js";

const DURATION_S = Number(process.env.BENCH_DURATION_S ?? 5);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 50);
const HUNG_TIMEOUT_MS = 1000;
/** Each source's answer time in the latency measures: 50 to 300 ms. */
const DELAYS_MS: Record<FakeSourceId, number> = {
  brave: 50, exa: 90, wikipedia: 130, hackernews: 170, stackoverflow: 210, github: 250, arxiv: 300, gdelt: 60,
};
const SLOWEST_MS = Math.max(...Object.values(DELAYS_MS));
const ALL = [...FAKE_SOURCE_IDS];

async function main() {
  const fakes = await startFakeSearch();
  const setDelays = (delays: Partial<Record<FakeSourceId, number>>, hung?: FakeSourceId) => {
    for (const id of FAKE_SOURCE_IDS) {
      const answer = defaultHandler(id);
      fakes.providers[id].reply(id === hung ? { hang: true } : (req) => ({ ...answer(req), delayMs: delays[id] ?? 0 }));
    }
  };

  const store = await openBenchStore(process.env.DATABASE_URL);
  const config = loadConfig({
    PORT: "0",
    TYPESAFE_LOG_LEVEL: "silent",
    TYPESAFE_LLM_EMBEDDED: "off",
    ...fakes.env,
    TYPESAFE_SEARCH_GDELT_TIMEOUT_MS: String(HUNG_TIMEOUT_MS),
    TYPESAFE_SEARCH_CACHE_ENTRIES: "100000",
    ...store.env,
  });
  const app = await startApp(config, createLogger(process.env.BENCH_LOG_LEVEL === "warn" ? "warn" : "silent"));
  const { db } = app.database;
  const apiKeys = (await createBenchAccounts(db, CONNECTIONS, 10_000)).map((a) => a.apiKey);

  const searchUrl = `${app.server.url}/api/v1/search`;
  const headersFor = (i: number) => ({ "content-type": "application/json", authorization: `Bearer ${apiKeys[i % apiKeys.length]}` });
  const body = (q: string) => JSON.stringify({ q, s: ALL });
  const filtered = (q: string) => JSON.stringify({ q, s: ALL, ...FILTERS });

  setDelays({});
  const warm = await fetch(searchUrl, { method: "POST", headers: headersFor(0), body: body("warm up") });
  const fixed = await warm.text();
  if (warm.status !== 200) throw new Error(`warm-up search answered ${warm.status}: ${fixed}`);

  const bare = await startBareBaseline(fixed);

  let sequence = 0;
  const run = async (url: string, connections: number, mode: "miss" | "hit", durationS = DURATION_S, make = body) => {
    const failures: string[] = [];
    return runAutocannon(
      {
        url,
        connections,
        duration: durationS,
        requests: [
          {
            method: "POST",
            setupRequest: (req) => {
              const n = sequence++;
              return { ...req, headers: headersFor(n), body: make(mode === "miss" ? `bench query ${n}` : "bench hot query") };
            },
            onResponse: (status, text) => {
              if (status !== 200 && failures.length < 3) failures.push(`${status} ${text.slice(0, 300)}`);
            },
          },
        ],
      },
      failures,
    );
  };

  try {
    console.log(
      `search bench: 8 sources, ${DURATION_S} s per measure, ${app.database.kind} store, Node ${process.version}; ` +
        `latency measures: sources answer after ${Object.entries(DELAYS_MS).map(([id, ms]) => `${id} ${ms}`).join(", ")} ms`,
    );
    const baseline = await run(bare.url, CONNECTIONS, "hit");

    const miss = await run(searchUrl, CONNECTIONS, "miss");
    await fetch(searchUrl, { method: "POST", headers: headersFor(0), body: body("bench hot query") });
    const hit = await run(searchUrl, CONNECTIONS, "hit");
    const hitSerial = await run(searchUrl, 1, "hit");
    const missFiltered = await run(searchUrl, CONNECTIONS, "miss", DURATION_S, filtered);
    await fetch(searchUrl, { method: "POST", headers: headersFor(0), body: filtered("bench hot query") });
    const hitFiltered = await run(searchUrl, 1, "hit", DURATION_S, filtered);
    const check = measureCheck();

    setDelays(DELAYS_MS);
    const fanOut = await run(searchUrl, 1, "miss");
    setDelays(DELAYS_MS, "gdelt");
    const hung = await run(searchUrl, 1, "miss", Math.max(DURATION_S, 3));

    const row = printTable(50, 6);
    row(`bare node:http, fixed JSON (${CONNECTIONS} conn)`, baseline, "1.00 (throughput baseline)");
    row(`search, cache miss, 0 ms sources (${CONNECTIONS} conn)`, miss, `${(miss.requests.average / baseline.requests.average).toFixed(3)} of bare req/s`);
    row(`search, cache hit (${CONNECTIONS} conn)`, hit, `${(hit.requests.average / baseline.requests.average).toFixed(3)} of bare req/s`);
    row("search, cache hit (1 conn)", hitSerial, "1.00 (latency of the service and metering alone)");
    row(`search, cache miss, filters (${CONNECTIONS} conn)`, missFiltered, `${(missFiltered.requests.average / miss.requests.average).toFixed(3)} of unfiltered miss req/s`);
    row("search, cache hit, filters (1 conn)", hitFiltered, `mean ${(hitFiltered.latency.average / hitSerial.latency.average).toFixed(3)} of unfiltered hit latency`);
    console.log(`filter check alone: ${check.nsPerResult.toFixed(0)} ns per result (10 domains to drop, a language; ${check.results} results)`);
    const overhead = fanOut.latency.average - SLOWEST_MS;
    row(
      `search, miss, sources 50–${SLOWEST_MS} ms (1 conn)`,
      fanOut,
      `mean ${fanOut.latency.average.toFixed(1)} ms = slowest source + ${overhead.toFixed(1)} ms`,
    );
    row(
      `search, miss, gdelt hung, cut at ${HUNG_TIMEOUT_MS} ms (1 conn)`,
      hung,
      `max ${hung.latency.max} ms = timeout + ${(hung.latency.max - HUNG_TIMEOUT_MS).toFixed(0)} ms (after 2 timeouts gdelt is suspended and skipped)`,
    );
    if (overhead > 25 || hung.latency.max > HUNG_TIMEOUT_MS + 250) process.exitCode = 1;
  } finally {
    await bare.close();
    await app.stop();
    await fakes.close();
    await store.cleanup();
  }
}

/** Filters of the filtered rows: every source still runs (nothing kept-only), each result is checked. */
const FILTERS = { xd: Array.from({ length: 10 }, (_, i) => `spam${i}.example`), l: "en", safe: "moderate" };

/** typesafe's own check alone, in process: the cost a filtered search adds per result. */
function measureCheck(): { nsPerResult: number; results: number } {
  const filters = readFilters(create(SearchRequestSchema, { q: "q", ...FILTERS }));
  const plan = completePlan(filters, { applied: { l: "post_filtered" } });
  const items = normalizeItems(Array.from({ length: 100 }, (_, i) => ({ title: `t${i}`, url: `https://site${i % 17}.example.org/p/${i}`, snippet: "", publishedAt: null, language: "en" })));
  let results = 0;
  const started = performance.now();
  while (performance.now() - started < 1000) {
    applyFilters(items, filters, plan);
    results += items.length;
  }
  return { nsPerResult: ((performance.now() - started) * 1e6) / results, results };
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
