/**
 * Two builds of the service, measured in turn under the same load: on a
 * shared, noisy machine a run before a change against a run after it shows
 * the machine's drift, not the change; alternating the two in one run does
 * not. Each build serves its own scratch database (a build may have a
 * migration the other refuses), with the fake upstream and the load
 * generator in processes of their own, as in `npm run bench`. With
 * BENCH_STORE=embedded that database is an embedded store in a temp folder.
 *
 *   BENCH_AB="old=/tmp/old/dist/bundle/main.mjs,new=dist/bundle/main.mjs" npm run bench:ab
 *   BENCH_AB="v8-default=dist/bundle/main.mjs --max-old-space-size=4096,start=dist/bundle/main.mjs" npm run bench:ab   # node options instead of npm start's
 *   BENCH_MODES=http,grpc-frames BENCH_ROUNDS=5 BENCH_DURATION_S=5 BENCH_QUESTIONS=1 npm run bench:ab
 *   BENCH_MODES=rate BENCH_RATE=500 npm run bench:ab     # latency at a fixed load (an open loop)
 *   BENCH_STORE=embedded BENCH_MODES=http npm run bench:ab   # each build on an embedded store of its own
 *
 * A build of another revision: `git worktree add /tmp/old <rev> && cd /tmp/old && npm ci &&
 * npm run build` (its bundle carries its own dependencies). Prints every round, then per mode
 * and build the medians of req/s, p50, p99, and the CPU per call of the service and of
 * PostgreSQL (every postgres process of this machine; NaN for a remote database),
 * then each build's peak RSS over the whole run. A build runs with `npm start`'s node
 * options unless its entry names others after the bundle.
 */
import { createKnex } from "../src/db/database.js";
import type { LoadOptions } from "./roles.js";
import { databaseCpuSeconds, startFakeUpstream, startLoadGenerator, startService, type ServiceProcess } from "./processes.js";
import { createDefaultAccounts, decideBody, embeddedStoreUrl, median, openBenchStore, type BenchStore } from "./support.js";

/** `name=bundle [node options]`: the options replace npm start's for that build. */
const BUILDS = (process.env.BENCH_AB ?? "")
  .split(",")
  .filter(Boolean)
  .map((entry) => {
    const [name, rest] = entry.split(/=(.*)/s) as [string, string];
    const [bundle, ...nodeOptions] = rest.trim().split(/\s+/);
    return { name, bundle: bundle!, nodeOptions: nodeOptions.length > 0 ? nodeOptions : undefined };
  });
const MODES = (process.env.BENCH_MODES ?? "http,grpc-frames").split(",") as LoadOptions["mode"][];
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5);
const DURATION_S = Number(process.env.BENCH_DURATION_S ?? 5);
const QUESTIONS = Number(process.env.BENCH_QUESTIONS ?? 1);
/** Requests per second of the `rate` mode (an open loop: latency at a fixed load rather than throughput). */
const RATE = Number(process.env.BENCH_RATE ?? 500);
const EMBEDDED = process.env.BENCH_STORE === "embedded";
const CONNECTIONS = 50;
const ACCOUNTS = 1_500;

interface Build {
  name: string;
  service: ServiceProcess;
  store: BenchStore;
  apiKeys: string[];
}

async function main() {
  if (BUILDS.length < 2) throw new Error('BENCH_AB must name two builds: "a=path/to/main.mjs,b=path/to/main.mjs"');
  const serverUrl = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
  const fake = await startFakeUpstream();
  const load = await startLoadGenerator();
  const builds: Build[] = [];
  try {
    for (const { name, bundle, nodeOptions } of BUILDS) {
      const store = await openBenchStore(EMBEDDED ? undefined : serverUrl);
      // A build that cannot start (say a bundle copied away from src/gen/openapi.json) ends the run; its store goes too.
      const service = await startService({ DATABASE_URL: "", ...store.env, TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_LLM_MODEL: "bench-model" }, { bundle, ...(nodeOptions ? { nodeOptions } : {}) }).catch(
        async (err: unknown) => {
          await store.cleanup();
          throw err;
        },
      );
      const db = createKnex(store.env.DATABASE_URL ?? (await embeddedStoreUrl(store.env.TYPESAFE_DATA_DIR!)), 4);
      builds.push({ name, service, store, apiKeys: await createDefaultAccounts(db, ACCOUNTS) });
      await db.destroy();
    }
    const body = decideBody(QUESTIONS);
    const run = (build: Build, mode: LoadOptions["mode"], durationS: number) =>
      load.run({
        mode,
        url: mode.startsWith("grpc") ? build.service.url : `${build.service.url}/api/v1/decisions`,
        body,
        apiKeys: build.apiKeys,
        connections: CONNECTIONS,
        durationS,
        rate: RATE,
      });
    for (const build of builds) for (const mode of MODES) await run(build, mode, 2); // warm-up

    const figures = new Map<string, { rps: number[]; p50: number[]; p99: number[]; cpuMs: number[]; dbCpuMs: number[] }>();
    for (let round = 0; round < ROUNDS; round++) {
      for (const mode of MODES) {
        // Every other round in reverse order, so neither build always follows the other.
        for (const build of round % 2 === 0 ? builds : [...builds].reverse()) {
          const before = await build.service.cpuSeconds();
          const dbBefore = await databaseCpuSeconds();
          const result = await run(build, mode, DURATION_S);
          const cpuMs = ((await build.service.cpuSeconds()) - before) * 1000 / result.requests;
          // An embedded store's PostgreSQL runs inside the service, so its CPU is in the service's figure.
          const dbCpuMs = EMBEDDED ? NaN : (((await databaseCpuSeconds()) ?? NaN) - (dbBefore ?? NaN)) * 1000 / result.requests;
          const key = `${mode} ${build.name}`;
          const entry = figures.get(key) ?? { rps: [], p50: [], p99: [], cpuMs: [], dbCpuMs: [] };
          figures.set(key, entry);
          entry.rps.push(result.rps);
          entry.p50.push(result.p50);
          entry.p99.push(result.p99);
          entry.cpuMs.push(cpuMs);
          entry.dbCpuMs.push(dbCpuMs);
          console.log(
            `round ${round + 1}  ${key.padEnd(20)} ${result.rps.toFixed(0)} req/s  p50 ${result.p50.toFixed(2)} ms  p99 ${result.p99.toFixed(2)} ms  service CPU ${cpuMs.toFixed(3)} ms/call  PostgreSQL CPU ${dbCpuMs.toFixed(3)} ms/call`,
          );
        }
      }
    }
    console.log(`medians of ${ROUNDS} rounds, ${QUESTIONS}-question decisions, ${CONNECTIONS} connections`);
    for (const [key, entry] of figures) {
      console.log(
        `${key.padEnd(20)} ${median(entry.rps).toFixed(0)} req/s  p50 ${median(entry.p50).toFixed(2)} ms  p99 ${median(entry.p99).toFixed(2)} ms  service CPU ${median(entry.cpuMs).toFixed(3)} ms/call  PostgreSQL CPU ${median(entry.dbCpuMs).toFixed(3)} ms/call`,
      );
    }
    for (const build of builds) console.log(`peak RSS of ${build.name.padEnd(12)} ${(await build.service.peakRssMb()).toFixed(0)} MB`);
  } finally {
    for (const build of builds) {
      await build.service.stop();
      await build.store.cleanup();
    }
    await load.close();
    await fake.close();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});
