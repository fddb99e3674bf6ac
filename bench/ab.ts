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
 *   BENCH_CALIBRATION=1 BENCH_MODES=http npm run bench:ab     # one build, its first question without and with a calibration
 *
 * BENCH_CALIBRATION=1 measures what applying a calibration costs a call: one
 * build (BENCH_AB's first, else this tree's bundle) answers the same decision
 * in four arms, alternated like builds: `plain`; `platt`, where the first
 * question (noul) names a Platt calibration fitted on synthetic answers, one
 * per account since a calibration is its account's; `contextual`, whose
 * content-free probe the warm-up has cached; and `plain-again`, the plain arm
 * once more, whose ratio to `plain` is the run's noise band (an A/A test): a
 * calibration costs nothing measurable when its ratio lies within that band.
 * Every arm sends the same keys, one body per key, and the warm-up sends each
 * arm's every body once, so no arm meets a cache the others found warm.
 * http mode only (a body per key). BENCH_ARMS=platt (names, comma-separated)
 * runs only those arms, e.g. to profile one with `--cpu-prof` in BENCH_AB's
 * node options.
 *
 * A build of another revision: `git worktree add /tmp/old <rev> && cd /tmp/old && npm ci &&
 * npm run build` (its bundle carries its own dependencies). Prints every round, then per mode
 * and build the medians of req/s, p50, p99, and the CPU per call of the service and of
 * PostgreSQL (the backends connected to the build's own database; NaN for a remote
 * database or an embedded store),
 * then each build's peak RSS over the whole run. A build runs with `npm start`'s node
 * options unless its entry names others after the bundle.
 */
import type { Knex } from "knex";
import { createKnex } from "../src/db/database.js";
import { MAX_CACHED_CALIBRATIONS } from "../src/decision/calibration.js";
import { PROMPT_VERSION } from "../src/decision/prompt.js";
import { SUPPORTED_MODEL } from "../src/decision/validate.js";
import { fitCalibration } from "../src/evaluation/calibration-fit.js";
import { signatureDigest } from "../src/evaluation/calibration-signature.js";
import { insertCalibration, signatureColumns, type CalibrationSignature } from "../src/evaluation/calibration-store.js";
import { seededRandom } from "../src/evaluation/seeded-random.js";
import type { LoadOptions } from "./roles.js";
import { buildService, databaseBackendsCpu, startFakeUpstream, startLoadGenerator, startService, type ServiceProcess } from "./processes.js";
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
const CALIBRATION = process.env.BENCH_CALIBRATION === "1";
const ARMS = process.env.BENCH_ARMS?.split(",").filter(Boolean);
const UPSTREAM_MODEL = "bench-model";
const CONNECTIONS = 50;
const ACCOUNTS = 1_500;

interface Build {
  name: string;
  service: ServiceProcess;
  store: BenchStore;
  apiKeys: string[];
  /** BENCH_CALIBRATION: per key, the decision whose first question names that key's account's Platt calibration. */
  plattBodies?: string[];
}

/**
 * The order of n arms in round `round`: a balanced Latin square (Williams
 * 1949). Over n rounds (2n when n is odd) each arm runs once in each place
 * and right after each other arm once, so neither a place in the round nor a
 * neighbour's leftovers (garbage, a warm cache, a busy database) favour one.
 */
function armOrder(n: number, round: number): number[] {
  const first: number[] = [];
  for (let low = 0, high = n - 1; first.length < n; ) {
    first.push(low++);
    if (first.length < n) first.push(high--);
  }
  const row = first.map((arm) => (arm + round) % n);
  return n % 2 === 1 && Math.floor(round / n) % 2 === 1 ? row.reverse() : row;
}

/** What one row measures: a build and the requests it is sent. */
interface Arm {
  name: string;
  build: Build;
  body: string;
  /** A body per key of `apiKeys` (the build's, or fewer). */
  bodies?: string[];
  apiKeys?: string[];
}

/**
 * A Platt calibration of the body's first question in each bench account
 * (`bench-<i>`, the key's index), fitted on synthetic answers whose log-odds
 * are twice the true ones; returns per key the body naming its account's.
 * Only as many accounts as a replica keeps calibrations in memory (less a
 * margin): more, read in turn, would each be read again on every call.
 */
async function plattBodies(db: Knex, body: string, apiKeys: readonly string[]): Promise<string[]> {
  const request = JSON.parse(body) as { questions: Record<string, { type: string; instructions: string; calibration?: string }> };
  const [key, question] = Object.entries(request.questions)[0]!;
  if (question.type !== "noul") throw new Error("BENCH_CALIBRATION: the first question must be noul");
  const random = seededRandom(42);
  const points = Array.from({ length: 200 }, () => {
    const p = 0.05 + 0.9 * random();
    return { probabilityTrue: 1 / (1 + Math.exp(-2 * Math.log(p / (1 - p)))), label: random() < p };
  });
  const fit = fitCalibration({ type: "noul", method: "platt", points });
  const signature: CalibrationSignature = { type: "noul", instructions: question.instructions, labels: [], promptVersion: PROMPT_VERSION, model: SUPPORTED_MODEL, upstream: UPSTREAM_MODEL };
  const accounts = new Map((await db("accounts").where("name", "like", "bench-%").select("id", "name")).map((a: { id: string; name: string }) => [a.name, a.id]));
  const bodies: string[] = [];
  for (let i = 0; i < Math.min(apiKeys.length, MAX_CACHED_CALIBRATIONS - 100); i++) {
    const row = await insertCalibration(db, {
      account_id: accounts.get(`bench-${i}`)!,
      evaluation_id: crypto.randomUUID(),
      question_key: key,
      method: "platt",
      ...signatureColumns(signature, signatureDigest(signature)),
      parameters: fit.params,
      held_out: fit.heldOut,
      created_by: "bench",
    });
    bodies.push(JSON.stringify({ ...request, questions: { ...request.questions, [key]: { ...question, calibration: row.id } } }));
  }
  return bodies;
}

/** The body with its first question asking for contextual calibration. */
function contextualBody(body: string): string {
  const request = JSON.parse(body) as { questions: Record<string, object> };
  const [key, question] = Object.entries(request.questions)[0]!;
  return JSON.stringify({ ...request, questions: { ...request.questions, [key]: { ...question, calibration: "contextual" } } });
}

async function main() {
  if (CALIBRATION && MODES.some((mode) => mode !== "http")) throw new Error("BENCH_CALIBRATION measures the http mode only: set BENCH_MODES=http");
  if (CALIBRATION && BUILDS.length === 0) {
    await buildService();
    BUILDS.push({ name: "this-tree", bundle: "dist/bundle/main.mjs", nodeOptions: undefined });
  }
  if (BUILDS.length < (CALIBRATION ? 1 : 2)) throw new Error('BENCH_AB must name two builds: "a=path/to/main.mjs,b=path/to/main.mjs"');
  const serverUrl = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
  const fake = await startFakeUpstream();
  const load = await startLoadGenerator();
  const builds: Build[] = [];
  try {
    const body = decideBody(QUESTIONS);
    for (const { name, bundle, nodeOptions } of CALIBRATION ? BUILDS.slice(0, 1) : BUILDS) {
      const store = await openBenchStore(EMBEDDED ? undefined : serverUrl);
      // A build that cannot start (say a bundle copied away from src/gen/openapi.json) ends the run; its store goes too.
      const service = await startService({ DATABASE_URL: "", ...store.env, TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_LLM_MODEL: UPSTREAM_MODEL }, { bundle, ...(nodeOptions ? { nodeOptions } : {}) }).catch(
        async (err: unknown) => {
          await store.cleanup();
          throw err;
        },
      );
      const db = createKnex(store.env.DATABASE_URL ?? (await embeddedStoreUrl(store.env.TYPESAFE_DATA_DIR!)), 4);
      const apiKeys = await createDefaultAccounts(db, ACCOUNTS);
      builds.push({ name, service, store, apiKeys, plattBodies: CALIBRATION ? await plattBodies(db, body, apiKeys) : undefined });
      await db.destroy();
    }
    // The arms of BENCH_CALIBRATION use the same keys (those whose accounts have a calibration), each with a body per key.
    const calibrated = CALIBRATION ? builds[0]!.apiKeys.slice(0, builds[0]!.plattBodies!.length) : [];
    const perKey = (json: string) => calibrated.map(() => json);
    const arms: Arm[] = CALIBRATION
      ? [
          { name: "plain", build: builds[0]!, body, bodies: perKey(body), apiKeys: calibrated },
          { name: "platt", build: builds[0]!, body, bodies: builds[0]!.plattBodies, apiKeys: calibrated },
          { name: "contextual", build: builds[0]!, body: contextualBody(body), bodies: perKey(contextualBody(body)), apiKeys: calibrated },
          { name: "plain-again", build: builds[0]!, body, bodies: perKey(body), apiKeys: calibrated },
        ].filter((arm) => !ARMS || ARMS.includes(arm.name))
      : builds.map((build) => ({ name: build.name, build, body }));
    if (arms.length === 0) throw new Error(`BENCH_ARMS names no arm of this run: ${ARMS!.join(",")}`);
    const run = (arm: Arm, mode: LoadOptions["mode"], durationS: number) =>
      load.run({
        mode,
        url: mode.startsWith("grpc") ? arm.build.service.url : `${arm.build.service.url}/api/v1/decisions`,
        body: arm.body,
        bodies: arm.bodies,
        apiKeys: arm.apiKeys ?? arm.build.apiKeys,
        connections: CONNECTIONS,
        durationS,
        rate: RATE,
      });
    // The warm-up also asks the contextual arm's probe, so its rounds measure the cached path.
    for (const arm of arms) for (const mode of MODES) await run(arm, mode, 2);
    // And each arm's every body once, so that the replica has read every calibration and key: the rounds measure the kept ones.
    for (const arm of arms.filter((a) => a.bodies)) {
      for (let i = 0; i < arm.bodies!.length; i += CONNECTIONS) {
        await Promise.all(
          arm.bodies!.slice(i, i + CONNECTIONS).map(async (json, j) => {
            const res = await fetch(`${arm.build.service.url}/api/v1/decisions`, {
              method: "POST",
              headers: { "content-type": "application/json", authorization: `Bearer ${arm.apiKeys![i + j]}` },
              body: json,
            });
            if (res.status !== 200) throw new Error(`warm-up of ${arm.name}: ${res.status} ${await res.text()}`);
          }),
        );
      }
    }

    // PostgreSQL's share: the backends of the build's own database (other people's tests may share this server).
    const databaseCpu = new Map(builds.map((build) => [build, build.store.env.DATABASE_URL ? databaseBackendsCpu(new URL(build.store.env.DATABASE_URL).pathname.slice(1)) : undefined]));
    const figures = new Map<string, { rps: number[]; p50: number[]; p99: number[]; cpuMs: number[]; dbCpuMs: number[] }>();
    for (let round = 0; round < ROUNDS; round++) {
      for (const mode of MODES) {
        for (const arm of armOrder(arms.length, round).map((i) => arms[i]!)) {
          const before = await arm.build.service.cpuSeconds();
          const dbBefore = await databaseCpu.get(arm.build)?.();
          const result = await run(arm, mode, DURATION_S);
          const cpuMs = ((await arm.build.service.cpuSeconds()) - before) * 1000 / result.requests;
          // An embedded store's PostgreSQL runs inside the service, so its CPU is in the service's figure.
          const dbCpuMs = EMBEDDED ? NaN : (((await databaseCpu.get(arm.build)?.()) ?? NaN) - (dbBefore ?? NaN)) * 1000 / result.requests;
          const key = `${mode} ${arm.name}`;
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
    // Each arm against the first, per mode: above 1 means more of it (req/s), or more time (p50, CPU). In brackets, the
    // lowest and highest of the rounds' own ratios (each round runs every arm): with BENCH_CALIBRATION, plain-again's is the noise band.
    for (const mode of MODES) {
      const first = figures.get(`${mode} ${arms[0]!.name}`)!;
      for (const arm of arms.slice(1)) {
        const entry = figures.get(`${mode} ${arm.name}`)!;
        const ratio = (key: "rps" | "p50" | "cpuMs" | "dbCpuMs") => {
          const rounds = entry[key].map((value, i) => value / first[key][i]!);
          return `${(median(entry[key]) / median(first[key])).toFixed(3)}× [${Math.min(...rounds).toFixed(3)}–${Math.max(...rounds).toFixed(3)}]`;
        };
        console.log(
          `${`${mode} ${arm.name} ÷ ${arms[0]!.name}`.padEnd(30)} req/s ${ratio("rps")}  p50 ${ratio("p50")}  service CPU ${ratio("cpuMs")}  PostgreSQL CPU ${ratio("dbCpuMs")}`,
        );
      }
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
