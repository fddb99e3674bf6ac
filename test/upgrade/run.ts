/**
 * npm run test:upgrade
 *
 * A rolling upgrade, as an operator runs one, under steady load. The previous
 * release (the commit in test/upgrade/previous-release.txt) is unpacked into a
 * temporary folder, installed and built; it starts on a fresh database and
 * serves decisions over the JSON gateway, Connect and gRPC, against a real
 * local OpenAI-compatible upstream that fails some calls. Then:
 *
 *   1 the previous release alone;
 *   2 the current release (this working tree) starts on the same database,
 *     migrating it, while a reader holds a transaction on `ledger` (as pg_dump
 *     does; 1.5 s once a migration's lock waits behind it) and the previous
 *     release keeps serving;
 *   3 both serve; idempotent calls are replayed on the other release;
 *   4 a replica of the previous release is killed and a new process of the
 *     old build starts on the migrated database (a pod rescheduled mid-rollout);
 *   5 both serve again; replays of the current release's calls go to it;
 *   6 the previous release gets SIGTERM while load continues on the current;
 *   7 the current release alone.
 *
 * It passes only if every answer is one its call kind expects, every release
 * starts on its first try and stops cleanly, each replay answers exactly what
 * its original answered, and the money holds (test/support/invariants.ts, and
 * every answer against its request row). It prints the figures and ends with
 * `N passed, M failed`; the exit code is 1 when a check failed.
 * Loopback only; bounded in calls and in time; everything it makes lives in a
 * temporary folder and a database it drops.
 */
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fromJson, toJson, type JsonObject } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import pg from "pg";
import { createKnex } from "../../src/db/database.js";
import { DecideRequestSchema, DecideResponseSchema, DecisionService } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { ErrorDetailSchema } from "../../src/gen/typesafe/error/v1/error_pb.js";
import { isProbe, logprobsReply, PROBE_OK, startFakeLlm, userContent } from "../support/fake-llm.js";
import { assertInvariants } from "../support/invariants.js";
import { createChecks, runWithHardLimit, seconds, sleep } from "../support/runner.js";

const ROOT = path.resolve(import.meta.dirname, "../..");
const RELEASE_FILE = path.join(ROOT, "test/upgrade/previous-release.txt");
const SERVER_URL = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
const WORKERS = 6;
/** Each worker paces itself to one call per this many ms: steady load, well under the accounts' limits. */
const PACE_MS = 125;
const MAX_CALLS_PER_WORKER = 2_000;
const PHASE_MS = { previousAlone: 6_000, both: 8_000, bothAfterRestart: 6_000, currentAlone: 4_000 };
const READER_HOLD_MS = 1_500;
const HARD_LIMIT_MS = 420_000;

/**
 * Previous releases known to answer an Idempotency-Key replay with the account
 * as it is at the replay instead of as the original's settle left it (fixed
 * after them). Their replays are compared on everything but the balance and the
 * free requests left; once the previous release moves past the fix, none is here.
 */
const REPLAY_SHOWS_ACCOUNT_AT_REPLAY = new Set(["8ca506e876ec6846c0f2e4b5f71b57d58cd74c34"]);

type Surface = "json" | "connect" | "grpc";
type Kind = "plain" | "upstream-fails" | "original" | "replay";
type ReleaseKind = "previous" | "current";

/** The one answer each call kind may get, per surface: anything else is unexpected. */
const EXPECTED: Record<Surface, Record<"answered" | "upstream-fails", string>> = {
  // UPSTREAM_FAILED is 502 on the gateway and UNAVAILABLE on gRPC and Connect (src/errors.ts, README's table).
  json: { answered: "200", "upstream-fails": "502 UPSTREAM_FAILED" },
  connect: { answered: "OK", "upstream-fails": "Unavailable UPSTREAM_FAILED" },
  grpc: { answered: "OK", "upstream-fails": "Unavailable UPSTREAM_FAILED" },
};

const checks = createChecks();
const check = checks.check;

// ---------------------------------------------------------------------------
// The two builds

function previousCommit(): string {
  const commit = fs
    .readFileSync(RELEASE_FILE, "utf8")
    .split("\n")
    .map((line) => line.trim())
    .find((line) => line !== "" && !line.startsWith("#"));
  if (!commit || !/^[0-9a-f]{7,40}$/.test(commit)) throw new Error(`${path.relative(ROOT, RELEASE_FILE)} holds no commit`);
  try {
    return execFileSync("git", ["rev-parse", "--verify", "--quiet", `${commit}^{commit}`], { cwd: ROOT, encoding: "utf8" }).trim();
  } catch {
    throw new Error(
      `the previous release ${commit} (${path.relative(ROOT, RELEASE_FILE)}) is not in this clone's history; ` +
        "clone with history (git fetch --unshallow) or move the file to a release this clone has",
    );
  }
}

/** Runs a command to its end; rejects with the tail of its output when it fails. */
function run(command: string, args: string[], cwd: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd, env: process.env, stdio: ["ignore", "pipe", "pipe"] });
    let output = "";
    child.stdout!.on("data", (chunk: Buffer) => (output = (output + chunk.toString()).slice(-4_000)));
    child.stderr!.on("data", (chunk: Buffer) => (output = (output + chunk.toString()).slice(-4_000)));
    child.on("error", reject);
    child.on("close", (code) =>
      code === 0 ? resolve() : reject(new Error(`${command} ${args.join(" ")} in ${cwd} exited with ${code}:\n${output}`)),
    );
  });
}

async function timed(work: () => Promise<void>): Promise<number> {
  const started = Date.now();
  await work();
  return Date.now() - started;
}

/** The previous release's files at its commit (no git state is touched), installed and built as its package.json says. */
async function preparePrevious(commit: string, dir: string): Promise<string> {
  const steps: string[] = [];
  let at = Date.now();
  const step = (name: string) => {
    steps.push(`${name} ${seconds(Date.now() - at)}`);
    at = Date.now();
  };
  fs.mkdirSync(dir);
  await new Promise<void>((resolve, reject) => {
    const archive = spawn("git", ["archive", "--format=tar", commit], { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"] });
    const tar = spawn("tar", ["-x", "-C", dir], { stdio: ["pipe", "inherit", "inherit"] });
    archive.stdout!.pipe(tar.stdin!);
    tar.on("close", (code) => (code === 0 ? resolve() : reject(new Error(`git archive ${commit} | tar -x exited with ${code}`))));
  });
  step("unpacked");
  await seedDependencies(dir);
  step("node_modules linked");
  await run("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund"], dir);
  step("installed");
  await run("npm", ["run", "build"], dir);
  step("built");
  return steps.join(", ");
}

/**
 * The previous release's node_modules starts as hard links to this tree's, so
 * `npm install` unpacks only what the previous release locks differently
 * instead of every package. npm never
 * edits an installed package's file in place: it replaces files and folders,
 * which breaks a link, so this tree's copy is never written to. The one file
 * npm rewrites, its record of the tree (node_modules/.package-lock.json), is
 * unlinked first. On another file system the install starts empty.
 */
async function seedDependencies(dir: string): Promise<void> {
  const target = path.join(dir, "node_modules");
  if (!fs.existsSync(path.join(ROOT, "node_modules"))) return;
  try {
    await run("cp", ["-al", path.join(ROOT, "node_modules"), target], dir);
    fs.rmSync(path.join(target, ".package-lock.json"), { force: true });
  } catch {
    fs.rmSync(target, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------------------
// Releases as processes

interface Release {
  label: string;
  kind: ReleaseKind;
  dir: string;
  child: ChildProcess;
  url: string;
  startMs: number;
  lines: string[];
  /** Its warnings and errors, printed when an answer was unexpected. */
  problems: string[];
  /** Its log lines about the schema: migrations applied, retried, or a newer schema served. */
  schemaLog: Array<Record<string, unknown>>;
  inFlight: number;
  onIdle?: () => void;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  connect: Client<typeof DecisionService>;
  grpc: Client<typeof DecisionService>;
}

/** Starts a build as `npm start` runs it (src/start.mjs), in its own process; rejects when it exits before listening. */
function startRelease(label: string, kind: ReleaseKind, dir: string, env: Record<string, string>): Promise<Release> {
  const started = Date.now();
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["src/start.mjs"], {
      cwd: dir,
      env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "", PORT: "0", HOST: "127.0.0.1", ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const lines: string[] = [];
    const schemaLog: Array<Record<string, unknown>> = [];
    const problems: string[] = [];
    const keep = (line: string) => {
      // The upstream failures the load asks for are expected; anything else is kept.
      if (/"level":"(warn|error)"/.test(line) && !/"llm call failed"|"UPSTREAM_FAILED"/.test(line) && problems.length < 20) problems.push(line);
      if (/"msg":"(migration|serving on a newer schema)/.test(line)) schemaLog.push(JSON.parse(line) as Record<string, unknown>);
      lines.push(line);
      if (lines.length > 40) lines.shift();
    };
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((done) =>
      child.on("exit", (code, signal) => done({ code, signal })),
    );
    let buffered = "";
    child.stdout!.on("data", (chunk: Buffer) => {
      buffered += chunk.toString();
      const parts = buffered.split("\n");
      buffered = parts.pop()!;
      for (const line of parts) {
        keep(line);
        if (!line.includes('"msg":"listening"')) continue;
        const url = String((JSON.parse(line) as { url: string }).url);
        resolve({
          label,
          kind,
          dir,
          child,
          url,
          startMs: Date.now() - started,
          lines,
          schemaLog,
          problems,
          inFlight: 0,
          exited,
          connect: createClient(DecisionService, createConnectTransport({ baseUrl: url, httpVersion: "1.1" })),
          grpc: createClient(DecisionService, createGrpcTransport({ baseUrl: url })),
        });
      }
    });
    child.stderr!.on("data", (chunk: Buffer) => chunk.toString().split("\n").filter(Boolean).forEach(keep));
    void exited.then(({ code, signal }) =>
      reject(new Error(`${label} exited (${code ?? signal}) before listening; its last lines:\n  ${lines.slice(-15).join("\n  ")}`)),
    );
  });
}

/** SIGTERM (or another signal) and the exit, bounded: a release that does not stop is killed and reported. */
async function stopRelease(release: Release, signal: NodeJS.Signals): Promise<{ code: number | null; signal: NodeJS.Signals | null; ms: number }> {
  const started = Date.now();
  release.child.kill(signal);
  const timer = setTimeout(() => release.child.kill("SIGKILL"), 20_000);
  const exit = await release.exited;
  clearTimeout(timer);
  return { ...exit, ms: Date.now() - started };
}

function runCli(dir: string, args: string[], databaseUrl: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ["dist/admin/cli.js", ...args], {
      cwd: dir,
      env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "", DATABASE_URL: databaseUrl },
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk));
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}

// ---------------------------------------------------------------------------
// Calls

interface Outcome {
  phase: string;
  release: string;
  releaseKind: ReleaseKind;
  surface: Surface;
  kind: Kind;
  /** "200", "502 UPSTREAM_FAILED", "OK", "Unavailable UPSTREAM_FAILED", "transport: …" */
  verdict: string;
  expected: boolean;
  requestId?: string;
  chargedUnits?: number;
  balanceUnits?: number;
  replayed: boolean;
  /** From sending the call to its answer. */
  ms: number;
  /** The whole answer as JSON (the gateway's envelope, or the response message), for replays. */
  answer?: unknown;
}

interface PendingReplay {
  surface: Surface;
  body: JsonObject;
  idempotencyKey: string;
  target: ReleaseKind;
  original: Outcome;
}

interface Account {
  id: string;
  apiKey: string;
}

const units = (credits: number | undefined) => (credits === undefined ? undefined : Math.round(credits * 1_000_000));

async function callJson(release: Release, account: Account, body: JsonObject, idempotencyKey?: string): Promise<Omit<Outcome, "phase" | "release" | "releaseKind" | "surface" | "kind" | "expected" | "ms">> {
  const response = await fetch(`${release.url}/api/v1/decisions`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      authorization: `Bearer ${account.apiKey}`,
      ...(idempotencyKey ? { "idempotency-key": idempotencyKey } : {}),
    },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(30_000),
  });
  const envelope = (await response.json()) as { data?: Record<string, unknown> };
  const data = envelope.data ?? {};
  const billing = data["billing"] as { charged_credits?: number; balance_credits?: number; request_id?: string } | undefined;
  const reason = response.status === 200 ? "" : ` ${String(data["reason"])}`;
  return {
    verdict: `${response.status}${reason}`,
    requestId: billing?.request_id ?? (data["request_id"] as string | undefined),
    chargedUnits: units(billing?.charged_credits),
    balanceUnits: units(billing?.balance_credits),
    replayed: response.headers.get("idempotent-replayed") === "true",
    answer: envelope,
  };
}

async function callRpc(
  client: Client<typeof DecisionService>,
  account: Account,
  body: JsonObject,
  idempotencyKey?: string,
): Promise<Omit<Outcome, "phase" | "release" | "releaseKind" | "surface" | "kind" | "expected" | "ms">> {
  let replayed = false;
  try {
    const response = await client.decide(fromJson(DecideRequestSchema, body), {
      headers: { authorization: `Bearer ${account.apiKey}`, ...(idempotencyKey ? { "idempotency-key": idempotencyKey } : {}) },
      timeoutMs: 30_000,
      onHeader: (headers) => (replayed = headers.get("idempotent-replayed") === "true"),
    });
    return {
      verdict: "OK",
      requestId: response.billing?.requestId,
      chargedUnits: units(response.billing?.chargedCredits),
      balanceUnits: units(response.billing?.balanceCredits),
      replayed,
      answer: toJson(DecideResponseSchema, response),
    };
  } catch (err) {
    const error = ConnectError.from(err);
    const detail = error.findDetails(ErrorDetailSchema)[0];
    return { verdict: `${Code[error.code]} ${detail?.reason ?? "(no reason)"}`, requestId: detail?.requestId || undefined, replayed };
  }
}

/** The answer without the account figures a known previous release reports as of the replay. */
function withoutAccountFigures(answer: unknown): unknown {
  const copy = structuredClone(answer) as { billing?: Record<string, unknown>; data?: { billing?: Record<string, unknown> } };
  for (const billing of [copy.billing, copy.data?.billing]) {
    if (!billing) continue;
    for (const key of ["balance_credits", "balanceCredits", "free_requests_remaining", "freeRequestsRemaining", "available_credits"]) delete billing[key];
  }
  return copy;
}

function decisionBody(marker: string, questions: number): JsonObject {
  return {
    model: "typesafe/service-1.13",
    state: { ticket: `upgrade case ${marker}` },
    questions: Object.fromEntries(Array.from({ length: questions }, (_, i) => [`q${i}`, { type: "noul", instructions: `Is aspect ${i} urgent?` }])),
  };
}

// ---------------------------------------------------------------------------
// The run

async function main(): Promise<void> {
  const startedAt = Date.now();
  const commit = previousCommit();
  const exemptReplays = REPLAY_SHOWS_ACCOUNT_AT_REPLAY.has(commit);
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-upgrade-"));
  const previousDir = path.join(tmp, "previous");
  const dbName = `typesafe_upgrade_${process.pid}`;
  const serverDb = createKnex(SERVER_URL, 1);
  const children: Release[] = [];
  const cleanups: Array<() => Promise<unknown> | unknown> = [];
  let upstreamFailures = 0;
  const upstream = await startFakeLlm((request) => {
    if (isProbe(request.body)) return PROBE_OK;
    const text = userContent(request);
    if (text.includes("upstream-down")) {
      upstreamFailures++;
      // OpenAI's 500 (platform.openai.com/docs/guides/error-codes: "500 - The server had an error while processing your request").
      return { status: 500, json: { error: { message: "The server had an error while processing your request. Sorry about that!", type: "server_error", param: null, code: null } } };
    }
    return logprobsReply({ yes: 0.7, no: 0.3 }, { prompt: 100 + (text.length % 150) });
  });

  try {
    process.stdout.write(`upgrade: previous release ${commit.slice(0, 10)}, current ${execFileSync("git", ["rev-parse", "--short=10", "HEAD"], { cwd: ROOT, encoding: "utf8" }).trim()} (this working tree)\n`);
    let previousSteps = "";
    const [previousPrepMs, currentBuildMs] = await Promise.all([
      timed(async () => void (previousSteps = await preparePrevious(commit, previousDir))),
      // As `npm start` builds: only when a source changed since the last build.
      timed(() => run(process.execPath, ["src/build.mjs", "--if-stale"], ROOT)),
    ]);
    process.stdout.write(`prepare: previous ready in ${seconds(previousPrepMs)} (${previousSteps}); current built (if stale) in ${seconds(currentBuildMs)}\n`);

    await serverDb.raw(`CREATE DATABASE ${dbName}`);
    cleanups.push(async () => {
      const drop = createKnex(SERVER_URL, 1);
      await drop.raw(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
      await drop.destroy();
    });
    const url = new URL(SERVER_URL);
    url.pathname = `/${dbName}`;
    const databaseUrl = url.toString();
    const db = createKnex(databaseUrl, 4);
    cleanups.push(() => db.destroy());

    const env = {
      DATABASE_URL: databaseUrl,
      TYPESAFE_LLM_BASE_URL: `${upstream.url}/v1`,
      TYPESAFE_LLM_MAX_RETRIES: "0",
      TYPESAFE_LLM_REQUEST_TIMEOUT_MS: "20000",
      TYPESAFE_LLM_CALL_TIMEOUT_MS: "10000",
      TYPESAFE_SEARCH_SOURCES: "none",
      TYPESAFE_SHUTDOWN_GRACE_MS: "10000",
    };
    const start = async (label: string, kind: ReleaseKind, what: string): Promise<Release | undefined> => {
      try {
        const release = await startRelease(label, kind, kind === "previous" ? previousDir : ROOT, env);
        children.push(release);
        check(what, true, `listening in ${seconds(release.startMs)}`);
        return release;
      } catch (err) {
        check(what, false, (err as Error).message);
        return undefined;
      }
    };

    // --- phase 1: the previous release on a fresh database
    const previousA = await start("previous#1", "previous", "the previous release starts on a fresh database, first try");
    if (!previousA) return;
    const accounts: Account[] = await Promise.all(
      Array.from({ length: WORKERS }, async (_, i) => {
        const made = await runCli(previousDir, ["accounts", "create", "--name", `upgrade-${i}`, "--credits", "50", "--free-requests", "4"], databaseUrl);
        if (made.code !== 0) throw new Error(`the previous release's CLI could not create an account: ${made.stderr}`);
        const account = JSON.parse(made.stdout) as { account_id: string; api_key: string };
        return { id: account.account_id, apiKey: account.api_key };
      }),
    );
    // Steady load stays well under the limits: every answer must be 200 or the documented upstream failure.
    await db("accounts").whereIn("id", accounts.map((a) => a.id)).update({ rate_limit: 1_000 });

    let phase = "1 previous alone";
    let live: Release[] = [previousA];
    let acceptOriginals = true;
    /** Originals sent and not yet answered: their replays are not queued yet. */
    let originalsInFlight = 0;
    let stopping = false;
    const outcomes: Outcome[] = [];
    const pending: PendingReplay[][] = accounts.map(() => []);
    const replayViolations: string[] = [];
    let exemptedBalanceDiffs = 0;

    const pick = (kind: ReleaseKind | undefined, n: number): Release | undefined => {
      const candidates = live.filter((r) => kind === undefined || r.kind === kind);
      return candidates[n % Math.max(candidates.length, 1)];
    };
    const other = (kind: ReleaseKind): ReleaseKind => (kind === "previous" ? "current" : "previous");

    async function call(release: Release, surface: Surface, kind: Kind, account: Account, body: JsonObject, idempotencyKey?: string): Promise<Outcome> {
      release.inFlight++;
      const callPhase = phase;
      const sent = Date.now();
      let result: Awaited<ReturnType<typeof callJson>>;
      try {
        result = surface === "json" ? await callJson(release, account, body, idempotencyKey) : await callRpc(release[surface], account, body, idempotencyKey);
      } catch (err) {
        result = { verdict: `transport: ${(err as Error).message}`, replayed: false };
      } finally {
        release.inFlight--;
        if (release.inFlight === 0) release.onIdle?.();
      }
      const wanted = EXPECTED[surface][kind === "upstream-fails" ? "upstream-fails" : "answered"];
      const outcome: Outcome = {
        phase: callPhase,
        release: release.label,
        releaseKind: release.kind,
        surface,
        kind,
        ...result,
        ms: Date.now() - sent,
        expected: result.verdict === wanted && result.replayed === (kind === "replay"),
      };
      outcomes.push(outcome);
      return outcome;
    }

    async function worker(w: number): Promise<void> {
      const account = accounts[w]!;
      for (let i = 0; i < MAX_CALLS_PER_WORKER && !stopping; i++) {
        const paced = sleep(PACE_MS);
        const surface = (["json", "connect", "grpc"] as const)[(i + w) % 3]!;
        const replayIndex = pending[w]!.findIndex((p) => live.some((r) => r.kind === p.target));
        if (replayIndex >= 0) {
          const replay = pending[w]!.splice(replayIndex, 1)[0]!;
          const release = pick(replay.target, i)!;
          const outcome = await call(release, replay.surface, "replay", account, replay.body, replay.idempotencyKey);
          if (outcome.verdict === EXPECTED[replay.surface].answered) {
            const same = exemptReplays && release.kind === "previous" ? withoutAccountFigures : (answer: unknown) => answer;
            if (JSON.stringify(same(outcome.answer)) !== JSON.stringify(same(replay.original.answer))) {
              replayViolations.push(
                `${replay.surface} replay on ${release.label} of ${replay.original.release}'s ${replay.original.requestId}: ` +
                  `${JSON.stringify(outcome.answer)} instead of ${JSON.stringify(replay.original.answer)}`,
              );
            } else if (JSON.stringify(outcome.answer) !== JSON.stringify(replay.original.answer)) {
              exemptedBalanceDiffs++;
            }
          }
          await paced;
          continue;
        }
        const release = pick(undefined, i + w);
        if (!release) {
          await paced;
          continue;
        }
        const marker = `${w}-${i}-${release.label}`;
        const questions = 1 + (i % 2);
        if (i % 8 === 4) {
          await call(release, surface, "upstream-fails", account, decisionBody(`${marker} upstream-down`, questions));
        } else if (i % 4 === 1 && acceptOriginals) {
          const body = decisionBody(marker, questions);
          const idempotencyKey = `upgrade-${process.pid}-${marker}`;
          originalsInFlight++;
          const original = await call(release, surface, "original", account, body, idempotencyKey);
          if (original.verdict === EXPECTED[surface].answered) pending[w]!.push({ surface, body, idempotencyKey, target: other(release.kind), original });
          originalsInFlight--;
        } else {
          await call(release, surface, "plain", account, decisionBody(marker, questions));
        }
        await paced;
      }
    }
    const waitUntil = async (condition: () => boolean, limitMs: number): Promise<boolean> => {
      const until = Date.now() + limitMs;
      while (!condition()) {
        if (Date.now() > until) return false;
        await sleep(50);
      }
      return true;
    };
    const idle = (release: Release) =>
      release.inFlight === 0 ? Promise.resolve() : new Promise<void>((resolve) => (release.onIdle = resolve));

    const workers = Promise.all(accounts.map((_, w) => worker(w)));
    const phaseTimes: Array<[string, number]> = [];
    let phaseStarted = Date.now();
    const nextPhase = (name: string) => {
      phaseTimes.push([phase, Date.now() - phaseStarted]);
      phase = name;
      phaseStarted = Date.now();
    };
    await sleep(PHASE_MS.previousAlone);

    // --- phase 2: the current release migrates the database while a reader holds ledger
    nextPhase("2 migration");
    const knexBefore = await db("knex_migrations").orderBy("id").pluck("name");
    const reader = new pg.Client({ connectionString: databaseUrl });
    await reader.connect();
    await reader.query("BEGIN");
    await reader.query("SELECT id FROM ledger LIMIT 1");
    const readerSince = Date.now();
    let currentUp = false;
    const currentStarting = start("current", "current", "the current release starts and migrates while the previous serves and a reader holds ledger, first try").finally(
      () => (currentUp = true),
    );
    // The reader holds on until the current release is up, or for READER_HOLD_MS once a
    // lock request on ledger (a migration's) waits behind it: the hold overlaps the migration.
    let waitingSince: number | undefined;
    while (!currentUp && (waitingSince === undefined || Date.now() - waitingSince < READER_HOLD_MS)) {
      if (waitingSince === undefined) {
        const { rows } = await db.raw<{ rows: { n: number }[] }>("SELECT count(*)::int AS n FROM pg_locks WHERE relation = 'ledger'::regclass AND NOT granted");
        if (rows[0]!.n > 0) waitingSince = Date.now();
      }
      await sleep(50);
    }
    await reader.query("COMMIT");
    await reader.end();
    const readerHeld = `reader held ledger ${seconds(Date.now() - readerSince)}${waitingSince === undefined ? ", no lock waited behind it" : `, a lock waited behind it ${seconds(Date.now() - waitingSince)}`}`;
    const current = await currentStarting;
    const knexAfter = await db("knex_migrations").orderBy("id").pluck("name");
    check(
      "the current release leaves knex_migrations as the previous release reads it",
      JSON.stringify(knexAfter) === JSON.stringify(knexBefore),
      `${knexBefore.length} rows before, ${knexAfter.length} after${knexAfter.length !== knexBefore.length ? `: added ${knexAfter.filter((n) => !knexBefore.includes(n)).join(", ")}` : ""}`,
    );
    const schemaTable = (await db.raw<{ rows: { present: boolean }[] }>("SELECT to_regclass('schema_migrations') IS NOT NULL AS present")).rows[0]!.present;
    const schemaRows = schemaTable ? Number((await db("schema_migrations").count({ n: "*" }))[0]!.n) : 0;
    process.stdout.write(
      `migration: the current release listened ${current ? seconds(current.startMs) : "never"} after its start (${readerHeld}); ` +
        `knex_migrations ${knexAfter.length} rows, schema_migrations ${schemaTable ? `${schemaRows} rows` : "absent"}\n`,
    );
    for (const entry of current?.schemaLog ?? []) {
      process.stdout.write(`  current: ${String(entry["msg"])} ${String(entry["migration"] ?? "")}${entry["duration_ms"] !== undefined ? ` in ${String(entry["duration_ms"])} ms` : ""}${entry["attempt"] !== undefined ? ` (attempt ${String(entry["attempt"])}, ${String(entry["code"])})` : ""}\n`);
    }

    let previousLive: Release | undefined = previousA;
    if (current) {
      // --- phase 3: both serve
      nextPhase("3 both");
      live = [previousA, current];
      const show = await runCli(previousDir, ["accounts", "show", "--account", accounts[0]!.id], databaseUrl);
      check("the previous release's CLI works on the migrated database", show.code === 0, show.code === 0 ? undefined : show.stderr.trim());
      await sleep(PHASE_MS.both);

      // --- phase 4: a replica of the previous release is killed and started again
      nextPhase("4 restart previous");
      live = [current];
      await idle(previousA);
      await stopRelease(previousA, "SIGKILL");
      previousLive = await start("previous#2", "previous", "a new replica of the previous release starts on the migrated database, first try");
      for (const entry of previousLive?.schemaLog ?? []) process.stdout.write(`  previous#2: ${JSON.stringify(entry)}\n`);
      if (previousLive) {
        // --- phase 5: both serve again; the current release's originals get replayed on the previous
        nextPhase("5 both after restart");
        live = [previousLive, current];
        await sleep(PHASE_MS.bothAfterRestart);
        acceptOriginals = false;
        const drained = await waitUntil(() => originalsInFlight === 0 && pending.every((p) => p.every((r) => r.target !== "previous")), 20_000);
        check("every replay meant for the previous release was sent", drained);
      }
      acceptOriginals = false;

      // --- phase 6: SIGTERM to the previous release while the current one serves
      nextPhase("6 previous stops");
      live = [current];
      if (previousLive) {
        // As a load balancer does, nothing is sent to it once it is told to stop: a call that reaches
        // a stopping replica is refused with UNAVAILABLE ("shutting down; retry") by design.
        await idle(previousLive);
        const stop = await stopRelease(previousLive, "SIGTERM");
        check("the previous release stops on SIGTERM with exit code 0", stop.code === 0, `exit ${stop.code ?? stop.signal} after ${seconds(stop.ms)}`);
      }

      // --- phase 7: the current release alone, until every replay is sent
      nextPhase("7 current alone");
      await sleep(PHASE_MS.currentAlone);
      await waitUntil(() => originalsInFlight === 0 && pending.every((p) => p.every((r) => r.target !== "current")), 20_000);
    }
    stopping = true;
    await workers;
    nextPhase("end");
    if (current) {
      const stop = await stopRelease(current, "SIGTERM");
      check("the current release stops on SIGTERM with exit code 0", stop.code === 0, `exit ${stop.code ?? stop.signal} after ${seconds(stop.ms)}`);
    }
    if (previousLive === previousA && previousA.child.exitCode === null) await stopRelease(previousA, "SIGTERM");
    const neverSent = pending.flat();
    check("every replay was sent", neverSent.length === 0, `${neverSent.length} left (their target release never came back)`);

    // --- the answers
    const unexpected = outcomes.filter((o) => !o.expected);
    check("every answer of both releases is the one its call kind expects", unexpected.length === 0, unexpected.slice(0, 5).map((o) => `${o.phase} ${o.release} ${o.surface} ${o.kind}: ${o.verdict}${o.replayed ? " (replayed)" : ""}`).join("; "));
    if (unexpected.length > 0) {
      for (const release of children) for (const line of release.problems.slice(0, 8)) process.stdout.write(`  ${release.label} logged: ${line}\n`);
    }
    const replays = outcomes.filter((o) => o.kind === "replay");
    check("each replay answers exactly what its original answered, billing included", replayViolations.length === 0, replayViolations.slice(0, 3).join("\n    "));
    const replayKinds = new Set(replays.map((o) => o.releaseKind));
    check("replays were served by both releases", replayKinds.has("previous") && replayKinds.has("current"), `${replays.length} replays`);

    // --- the money
    const moneyViolations: string[] = [];
    for (const account of accounts) {
      try {
        await assertInvariants(db, account.id);
      } catch (err) {
        moneyViolations.push(`${account.id}: ${(err as Error).message.split("\n").slice(0, 12).join(" ")}`);
      }
    }
    check("the ledger invariants hold for every account (balance = grants − settles, counters, one hold and one final entry per request)", moneyViolations.length === 0, moneyViolations.join("\n    "));
    const active = Number((await db("requests").where({ status: "active" }).count({ n: "*" }))[0]!.n);
    check("no holds are left", active === 0, `${active} active requests`);

    const rows = new Map(
      (await db("requests").whereIn("account_id", accounts.map((a) => a.id)).select("id", "status", "charged")).map((r) => [r.id as string, r as { status: string; charged: number }]),
    );
    const settleEntries = new Map(
      (await db("ledger").where({ kind: "settle" }).select("request_id", "balance_after")).map((e) => [e.request_id as string, e.balance_after as number | null]),
    );
    const answerViolations: string[] = [];
    const fresh = outcomes.filter((o) => o.kind !== "replay" && o.expected);
    for (const o of fresh) {
      const row = o.requestId ? rows.get(o.requestId) : undefined;
      if (!row) {
        answerViolations.push(`${o.release} ${o.surface} ${o.verdict}: no request row for ${o.requestId ?? "(no request id)"}`);
      } else if (o.kind === "upstream-fails") {
        if (row.status !== "released" || row.charged !== 0) answerViolations.push(`${o.requestId} answered ${o.verdict} but its row is ${row.status}, charged ${row.charged}`);
      } else if (row.status !== "settled" || row.charged !== o.chargedUnits) {
        answerViolations.push(`${o.requestId} answered ${o.chargedUnits} units charged; its row is ${row.status}, charged ${row.charged}`);
      } else if (settleEntries.get(o.requestId!) !== o.balanceUnits) {
        answerViolations.push(`${o.requestId} answered a balance of ${o.balanceUnits} units; its settle left ${settleEntries.get(o.requestId!)}`);
      }
    }
    const answeredIds = new Set(fresh.map((o) => o.requestId));
    const unanswered = [...rows.keys()].filter((id) => !answeredIds.has(id));
    check("every answer agrees with its request row (status, charge, balance as its settle left it)", answerViolations.length === 0, answerViolations.slice(0, 5).join("\n    "));
    check("every request row belongs to one answer", unanswered.length === 0 && answeredIds.size === fresh.length, `${rows.size} rows, ${fresh.length} answers, ${unanswered.length} rows without an answer`);

    // --- the figures
    const table = new Map<string, Outcome[]>();
    for (const o of outcomes) table.set(`${o.phase}|${o.release}`, [...(table.get(`${o.phase}|${o.release}`) ?? []), o]);
    const lines = [
      "phase                   release     calls  answered  upstream-failed  replays  unexpected  slowest",
      ...[...table].map(([key, list]) => {
        const [phaseName, label] = key.split("|") as [string, string];
        const answered = list.filter((o) => o.expected && o.kind !== "upstream-fails").length;
        const failed = list.filter((o) => o.expected && o.kind === "upstream-fails").length;
        return `${phaseName.padEnd(24)}${label.padEnd(12)}${String(list.length).padStart(5)}${String(answered).padStart(10)}${String(failed).padStart(17)}${String(list.filter((o) => o.kind === "replay").length).padStart(9)}${String(list.filter((o) => !o.expected).length).padStart(12)}${seconds(Math.max(...list.map((o) => o.ms))).padStart(9)}`;
      }),
    ];
    process.stdout.write(`\n${lines.join("\n")}\n\n`);
    process.stdout.write(`phases: ${phaseTimes.map(([name, ms]) => `${name} ${seconds(ms)}`).join(", ")}\n`);
    const bySurface = (["json", "connect", "grpc"] as const).map((s) => `${s} ${outcomes.filter((o) => o.surface === s).length}`).join(", ");
    process.stdout.write(
      `calls: ${outcomes.length} (${bySurface}); unexpected ${unexpected.length}; upstream 500s sent ${upstreamFailures}; ` +
        `replays ${replays.length} (on previous ${replays.filter((r) => r.releaseKind === "previous").length}, on current ${replays.filter((r) => r.releaseKind === "current").length})` +
        (exemptReplays ? `; replays on ${commit.slice(0, 10)} showing the account at the replay (known, not compared): ${exemptedBalanceDiffs}` : "") +
        "\n",
    );
    const balances = await db("accounts").whereIn("id", accounts.map((a) => a.id)).sum({ balance: "balance" }).first();
    const granted = await db("ledger").whereIn("account_id", accounts.map((a) => a.id)).where({ kind: "grant" }).sum({ units: "amount" }).first();
    const charged = await db("ledger").whereIn("account_id", accounts.map((a) => a.id)).where({ kind: "settle" }).sum({ units: "amount" }).first();
    process.stdout.write(
      `money: ${accounts.length} accounts, balances ${Number(balances?.balance)} units = grants ${Number(granted?.units)} − settles ${Number(charged?.units)}; ` +
        `${rows.size} request rows, active ${active}; invariant failures ${moneyViolations.length}; answer-row mismatches ${answerViolations.length}\n`,
    );
  } catch (err) {
    check("the run completes", false, err instanceof Error ? err.message : String(err));
  } finally {
    for (const child of children) if (child.child.exitCode === null && child.child.signalCode === null) child.child.kill("SIGKILL");
    await Promise.all(children.map((c) => c.exited));
    await upstream.close();
    for (const cleanup of cleanups.reverse()) await Promise.resolve(cleanup()).catch(() => {});
    await serverDb.destroy();
    fs.rmSync(tmp, { recursive: true, force: true });
    tmp = undefined;
    process.stdout.write(checks.report(startedAt, 80));
    process.exitCode = checks.exitCode();
  }
}

/** The temporary folder, removed on every way out. */
let tmp: string | undefined;

runWithHardLimit("upgrade", HARD_LIMIT_MS, main, () => {
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});
