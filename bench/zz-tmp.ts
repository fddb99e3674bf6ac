import { create } from "@bufbuild/protobuf";
import { SearchRequestSchema } from "/work/main/src/gen/typesafe/search/v1/search_service_pb.js";
import { createLogger } from "/work/main/src/logger.js";
import { createSearchEngine } from "/work/main/src/search/engine.js";
import { startFakeSearch, FAKE_SOURCE_IDS } from "/work/main/test/support/fake-search/providers.js";
const fakes = await startFakeSearch();
const e = createSearchEngine({ config: { requestTimeoutMs: 10000, env: fakes.env }, logger: createLogger("silent") });
const plan = e.resolve(create(SearchRequestSchema, { q: "x", s: [...FAKE_SOURCE_IDS] }));
let n = 0;
const t0 = performance.now();
await Promise.all(Array.from({ length: 50 }, async () => {
  while (n < 3000) { const i = n++; await e.search(plan, `q ${i}`, new AbortController().signal); }
}));
const dt = performance.now() - t0;
console.log(`${(3000 / dt * 1000).toFixed(0)} searches/s`);
await fakes.close();
