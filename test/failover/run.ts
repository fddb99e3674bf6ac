/**
 * npm run test:failover
 *
 * The primary database is lost while the service is under load, as it happens
 * in production, on a real pg_auto_failover formation (Debian's
 * postgresql-15-auto-failover): a monitor, a primary and one synchronous
 * standby on free loopback ports, in a temporary folder. Two service replicas
 * run on the formation's multi-host URI (`pg_autoctl show uri`), and workers
 * send decisions and searches from several accounts over the JSON gateway,
 * part of them with an Idempotency-Key. Then:
 *
 *   1 steady load;
 *   2 a planned switch: `pg_autoctl perform switchover`;
 *   3 an unplanned one: `kill -9` of the primary node (its pg_autoctl keeper
 *     and its postgres, the whole process group), the monitor promotes the
 *     standby.
 *
 * The monitor's health checks are shortened for the run (see MONITOR_SETTINGS;
 * docs/high-availability.md says what each one bounds). It passes only if every
 * answer is 200 or a 503 UNAVAILABLE with Retry-After, none later than the
 * call's deadline; every 503'd call with a key, sent again with it until it is
 * answered, is charged exactly once; every answered call's charge is in the
 * new primary's ledger; no hold is left; the ledger invariants hold
 * (balance = grants − settles); /readyz said 503 while no primary answered and
 * 200 after; both replicas count the primary changes. It prints, per switch,
 * the calls by outcome and the time from the loss to the first call served
 * again, and ends with `N passed, M failed` (exit code 1 when a check failed).
 * It stops everything it started and removes its folder.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import pg from "pg";
import { createKnex } from "../../src/db/database.js";
import { isProbe, logprobsReply, PROBE_OK, startFakeLlm } from "../support/fake-llm.js";
import { startFakeSearch } from "../support/fake-search/providers.js";
import { assertInvariants } from "../support/invariants.js";
import { runAdmin, startServiceProcess, type ServiceProcess } from "../support/process.js";
import { createChecks, runWithHardLimit, seconds, sleep } from "../support/runner.js";

const HARD_LIMIT_MS = 300_000;
const ACCOUNTS = 4;
/** Each worker paces itself to one call per this many ms. */
const PACE_MS = 60;
/** The decision and search deadlines the replicas run with. */
const CALL_DEADLINE_MS = 5_000;
/**
 * What an answer may take beyond its deadline: a settle that cannot be
 * written is retried for 3.75 s (the meter's retry schedule), then released
 * instead, which is retried as long, before the call is answered 503; plus
 * the answer's way back. Anything later is a hang.
 */
const CALL_SLACK_MS = 9_000;
const PHASE_MS = { steady: 4_000, afterSwitch: 10_000 };
/**
 * pg_auto_failover's monitor settings for the run (defaults in brackets): a
 * node is checked every second [5 s] with a 1 s timeout [5 s] and one retry
 * after 0.5 s [2 retries after 2 s]; it is unhealthy after 2 s without
 * contact [20 s]; a lost primary is given 3 s to demote itself [30 s].
 */
const MONITOR_SETTINGS: Record<string, number> = {
  "pgautofailover.health_check_period": 1_000,
  "pgautofailover.health_check_timeout": 1_000,
  "pgautofailover.health_check_max_retries": 1,
  "pgautofailover.health_check_retry_delay": 500,
  "pgautofailover.node_considered_unhealthy_timeout": 2_000,
  "pgautofailover.primary_demote_timeout": 3_000,
};

/** What the background workers log when one round fails (src/metering/sweeper.ts, src/webhooks/). */
const BACKGROUND_FAILURES = ["sweep failed", "usage roll-up failed", "key expiry check failed", "webhook delivery failed"];

const checks = createChecks();
const check = checks.check;

// ---------------------------------------------------------------------------
// The formation

const bin = ["/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin"].find((dir) => fs.existsSync(`${dir}/pg_ctl`)) ?? "/usr/lib/postgresql/15/bin";
const asRoot = process.getuid?.() === 0;

interface Node {
  name: string;
  port: number;
  pgdata: string;
  process: ChildProcess;
  exited: Promise<void>;
}

function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const server = net.createServer().listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** pg_autoctl refuses root: it runs as postgres, with its XDG folders and sockets inside the run's folder. */
function autoctlCommand(tmp: string, args: string[]): [string, string[]] {
  const env = [`XDG_CONFIG_HOME=${tmp}/config`, `XDG_DATA_HOME=${tmp}/data`, `XDG_RUNTIME_DIR=${tmp}/run`, `PG_REGRESS_SOCK_DIR=${tmp}/run`, `PATH=${bin}:${process.env.PATH ?? ""}`];
  const command = ["env", ...env, "pg_autoctl", ...args];
  return asRoot ? ["runuser", ["-u", "postgres", "--", ...command]] : [command[0]!, command.slice(1)];
}

/** A pg_autoctl command to its end, without blocking the load that runs meanwhile. */
function autoctl(tmp: string, args: string[]): Promise<string> {
  const [file, argv] = autoctlCommand(tmp, args);
  return new Promise((resolve, reject) => {
    const child = spawn(file, argv, { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk));
    child.stderr.on("data", (chunk: Buffer) => (stderr = (stderr + chunk.toString()).slice(-2_000)));
    child.on("error", reject);
    child.on("close", (code) => (code === 0 ? resolve(stdout) : reject(new Error(`pg_autoctl ${args.join(" ")} exited with ${code}: ${stderr}`))));
  });
}

/** A node's `pg_autoctl create … --run`, in a process group of its own so that it can be killed whole. */
function startNode(tmp: string, name: string, port: number, args: string[]): Node {
  const pgdata = path.join(tmp, name);
  const [file, argv] = autoctlCommand(tmp, [...args, "--pgdata", pgdata, "--pgport", String(port), "--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--run"]);
  const log = fs.openSync(path.join(tmp, `${name}.log`), "a");
  const child = spawn(file, argv, { detached: true, stdio: ["ignore", log, log] });
  fs.closeSync(log);
  const exited = new Promise<void>((resolve) => child.on("exit", () => resolve()));
  return { name, port, pgdata, process: child, exited };
}

async function query<T extends pg.QueryResultRow>(port: number, database: string, text: string): Promise<T[]> {
  const client = new pg.Client({ host: "127.0.0.1", port, user: "postgres", database, connectionTimeoutMillis: 1_000 });
  client.on("error", () => {});
  await client.connect();
  try {
    return (await client.query<T>(text)).rows;
  } finally {
    await client.end().catch(() => {});
  }
}

async function until(condition: () => Promise<boolean>, what: string, limitMs: number, everyMs = 200, onWait?: () => Promise<void>): Promise<void> {
  const deadline = Date.now() + limitMs;
  while (!(await condition().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`timed out after ${seconds(limitMs)} waiting for ${what}`);
    await onWait?.().catch(() => {});
    await sleep(everyMs);
  }
}

async function nodeStates(monitorPort: number): Promise<Map<string, string>> {
  const rows = await query<{ nodename: string; reportedstate: string; goalstate: string }>(monitorPort, "pg_auto_failover", "SELECT nodename, reportedstate, goalstate FROM pgautofailover.node");
  return new Map(rows.map((r) => [r.nodename, r.reportedstate === r.goalstate ? r.reportedstate : `${r.reportedstate}>${r.goalstate}`]));
}

async function writable(port: number): Promise<boolean> {
  const rows = await query<{ transaction_read_only: string }>(port, "app", "SHOW transaction_read_only");
  return rows[0]?.transaction_read_only === "off";
}

// ---------------------------------------------------------------------------
// Calls

type Kind = "decide" | "search";
interface Outcome {
  phase: string;
  replica: number;
  kind: Kind;
  key?: string;
  /** "200", "503 UNAVAILABLE", "transport: …" */
  verdict: string;
  retryAfter?: string;
  requestId?: string;
  chargedUnits?: number;
  replayed: boolean;
  sentAt: number;
  answeredAt: number;
  retry: boolean;
}
interface Account {
  id: string;
  apiKey: string;
}

async function callJson(url: string, account: Account, kind: Kind, body: object, key?: string) {
  const response = await fetch(`${url}/api/v1/${kind === "decide" ? "decisions" : "search"}`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${account.apiKey}`, ...(key ? { "idempotency-key": key } : {}) },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(CALL_DEADLINE_MS + CALL_SLACK_MS + 5_000),
  });
  const envelope = (await response.json()) as { data?: Record<string, unknown> };
  const data = envelope.data ?? {};
  // A decision's money is in `billing`, a search's in `cost` (the same fields).
  const billing = (data["billing"] ?? data["cost"]) as { charged_credits?: number; request_id?: string } | undefined;
  return {
    verdict: response.status === 200 ? "200" : `${response.status} ${String(data["reason"])}`,
    retryAfter: response.headers.get("retry-after") ?? undefined,
    requestId: billing?.request_id ?? (data["request_id"] as string | undefined),
    chargedUnits: billing?.charged_credits === undefined ? undefined : Math.round(billing.charged_credits * 1_000_000),
    replayed: response.headers.get("idempotent-replayed") === "true",
  };
}

// ---------------------------------------------------------------------------
// The run

async function main(): Promise<void> {
  const startedAt = Date.now();
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-failover-"));
  fs.mkdirSync(path.join(tmp, "run"));
  if (asRoot) spawnSync("chown", ["-R", "postgres", tmp]);
  const replicas: ServiceProcess[] = [];
  const llm = await startFakeLlm((request) => (isProbe(request.body) ? PROBE_OK : logprobsReply({ yes: 0.7, no: 0.3 }, { prompt: 120 })));
  const search = await startFakeSearch({ ids: ["hackernews"] });
  let db: ReturnType<typeof createKnex> | undefined;
  try {
    // --- the formation: a monitor, a primary, one synchronous standby
    const [monitorPort, port1, port2] = [await freePort(), await freePort(), await freePort()];
    const formedStart = Date.now();
    const monitor = startNode(tmp, "monitor", monitorPort, ["create", "monitor"]);
    nodes.push(monitor);
    await until(async () => (await query(monitorPort, "pg_auto_failover", "SELECT 1")).length === 1, "the monitor", 60_000);
    for (const [name, value] of Object.entries(MONITOR_SETTINGS)) await query(monitorPort, "pg_auto_failover", `ALTER SYSTEM SET ${name} = ${value}`);
    await query(monitorPort, "pg_auto_failover", "SELECT pg_reload_conf()");
    const monitorUrl = `postgres://autoctl_node@127.0.0.1:${monitorPort}/pg_auto_failover?sslmode=disable`;
    const dataNode = (name: string, port: number) =>
      startNode(tmp!, name, port, ["create", "postgres", "--name", name, "--dbname", "app", "--listen", "127.0.0.1", "--pghost", path.join(tmp!, "run"), "--monitor", monitorUrl]);
    nodes.push(dataNode("node1", port1));
    await until(async () => (await nodeStates(monitorPort)).get("node1") === "single", "node1 as a single primary", 60_000);
    nodes.push(dataNode("node2", port2));
    // pg_basebackup waits for a spread checkpoint (minutes on an idle server); a CHECKPOINT on the primary ends it at once.
    await until(
      async () => {
        const states = await nodeStates(monitorPort);
        return states.get("node1") === "primary" && states.get("node2") === "secondary";
      },
      "node1 primary and node2 its standby",
      120_000,
      300,
      async () => void (await query(port1, "app", "CHECKPOINT")),
    );
    const sync = await query<{ synchronous_standby_names: string }>(port1, "app", "SHOW synchronous_standby_names");
    check("the formation has a primary and a synchronous standby", sync[0]!.synchronous_standby_names !== "", `formed in ${seconds(Date.now() - formedStart)}; synchronous_standby_names = ${sync[0]!.synchronous_standby_names}`);
    // The formation's URI names no user (libpq takes the login name); the service is told which, as an operator would.
    const uri = (await autoctl(tmp, ["show", "uri", "--pgdata", monitor.pgdata, "--formation", "default"])).trim().replace(/^postgres:\/\//, "postgres://postgres@");
    process.stdout.write(`formation: monitor :${monitorPort}, node1 :${port1}, node2 :${port2}; uri ${uri}\n`);

    // --- the schema, accounts and two replicas, all on the multi-host URI
    db = createKnex(uri, 4);
    const env = {
      DATABASE_URL: uri,
      ...search.env,
      TYPESAFE_SEARCH_CACHE_ENTRIES: "0",
      TYPESAFE_LLM_BASE_URL: `${llm.url}/v1`,
      TYPESAFE_LLM_MAX_RETRIES: "0",
      TYPESAFE_LLM_REQUEST_TIMEOUT_MS: String(CALL_DEADLINE_MS),
      TYPESAFE_SEARCH_REQUEST_TIMEOUT_MS: String(CALL_DEADLINE_MS),
      TYPESAFE_LEASE_MARGIN_MS: "1000",
      TYPESAFE_SWEEP_INTERVAL_MS: "500",
      // The background workers tick often, so that each meets the switches.
      TYPESAFE_USAGE_ROLLUP_INTERVAL_MS: "500",
      TYPESAFE_WEBHOOK_POLL_MS: "250",
      TYPESAFE_WEBHOOK_KEY_EXPIRY_CHECK_MS: "500",
      TYPESAFE_DB_STATEMENT_TIMEOUT_MS: "2000",
      TYPESAFE_LOG_LEVEL: "info",
    };
    for (let i = 0; i < 2; i++) replicas.push(await startServiceProcess(env));
    const accounts: Account[] = [];
    for (let i = 0; i < ACCOUNTS; i++) {
      const made = await runAdmin(["accounts", "create", "--name", `failover-${i}`, "--credits", "100"], { DATABASE_URL: uri });
      if (made.code !== 0) throw new Error(`the CLI could not create an account on the multi-host URI: ${made.stderr}`);
      const account = JSON.parse(made.stdout) as { account_id: string; api_key: string };
      accounts.push({ id: account.account_id, apiKey: account.api_key });
    }
    check("the operator CLI works on the multi-host URI", true, `${ACCOUNTS} accounts`);
    await db("accounts").whereIn("id", accounts.map((a) => a.id)).update({ rate_limit: 100_000 });

    // --- load
    let phase = "1 steady";
    let stopping = false;
    const outcomes: Outcome[] = [];
    /** Keyed calls answered 503, waiting to be sent again with their key. */
    const owed: Array<{ account: Account; kind: Kind; body: object; key: string; tries: number }> = [];
    const readiness: Array<{ at: number; replica: number; status: number }> = [];

    async function send(replica: number, account: Account, kind: Kind, body: object, key: string | undefined, retry: boolean): Promise<Outcome> {
      const callPhase = phase;
      const sentAt = Date.now();
      let result: Awaited<ReturnType<typeof callJson>> | { verdict: string; replayed: boolean };
      try {
        result = await callJson(replicas[replica]!.url, account, kind, body, key);
      } catch (err) {
        result = { verdict: `transport: ${(err as Error).message}`, replayed: false };
      }
      const outcome: Outcome = { phase: callPhase, replica, kind, key, sentAt, answeredAt: Date.now(), retry, ...result };
      outcomes.push(outcome);
      return outcome;
    }

    async function worker(w: number): Promise<void> {
      const account = accounts[w % accounts.length]!;
      for (let i = 0; !stopping; i++) {
        const paced = sleep(PACE_MS);
        const replica = (w + i) % replicas.length;
        const due = owed.findIndex((o) => o.account === account);
        if (due >= 0) {
          const call = owed.splice(due, 1)[0]!;
          const outcome = await send(replica, account, call.kind, call.body, call.key, true);
          // 409 IDEMPOTENCY_IN_PROGRESS: the first attempt's hold is still open (its settle is being retried, or its lease runs).
          if (outcome.verdict !== "200" && call.tries < 60) owed.push({ ...call, tries: call.tries + 1 });
          await sleep(outcome.retryAfter ? Number(outcome.retryAfter) * 1000 : PACE_MS);
          continue;
        }
        const kind: Kind = i % 3 === 2 ? "search" : "decide";
        const body = kind === "decide" ? decisionBody(`${w}-${i}`) : { q: `failover ${w}-${i}`, s: ["hackernews"] };
        const key = i % 2 === 0 ? `failover-${process.pid}-${w}-${i}` : undefined;
        const outcome = await send(replica, account, kind, body, key, false);
        if (key && outcome.verdict !== "200") owed.push({ account, kind, body, key, tries: 1 });
        await paced;
      }
    }
    const readinessProbe = (async () => {
      while (!stopping) {
        for (let r = 0; r < replicas.length; r++) {
          const status = await fetch(`${replicas[r]!.url}/readyz`, { signal: AbortSignal.timeout(3_000) }).then((res) => res.status, () => 0);
          readiness.push({ at: Date.now(), replica: r, status });
        }
        await sleep(100);
      }
    })();
    const workers = Promise.all(Array.from({ length: ACCOUNTS * 2 }, (_, w) => worker(w)));
    await sleep(PHASE_MS.steady);

    // --- the switches
    interface Switch {
      name: string;
      lostAt: number;
      promotedAt?: number;
      from: Node;
      to: Node;
    }
    const switches: Switch[] = [];
    const primaryNode = async () => {
      for (const node of nodes.slice(1)) if (await writable(node.port).catch(() => false)) return node;
      throw new Error("no node is writable");
    };
    async function awaitPromotion(s: Switch): Promise<void> {
      await until(async () => writable(s.to.port), `${s.to.name} to accept writes`, 60_000, 50);
      s.promotedAt = Date.now();
    }

    phase = "2 planned switchover";
    {
      const from = await primaryNode();
      const to = nodes.slice(1).find((n) => n !== from)!;
      const s: Switch = { name: phase, lostAt: Date.now(), from, to };
      switches.push(s);
      const promoted = awaitPromotion(s);
      await autoctl(tmp, ["perform", "switchover", "--pgdata", monitor.pgdata, "--formation", "default"]);
      await promoted;
      await sleep(PHASE_MS.afterSwitch);
    }
    // The old primary rejoins as the standby before the next loss, so that there is one to promote.
    await until(async () => [...(await nodeStates(monitorPort)).values()].filter((state) => state === "secondary").length === 1, "a standby again", 60_000);

    phase = "3 kill -9 of the primary";
    {
      const from = await primaryNode();
      const to = nodes.slice(1).find((n) => n !== from)!;
      const s: Switch = { name: phase, lostAt: Date.now(), from, to };
      switches.push(s);
      // The whole node: its pg_autoctl keeper (so nothing restarts postgres) and its postgres.
      // A postgres killed so leaves its small System V segment behind (postmaster.pid's line 7 names it): removed at the end.
      orphanSegments.push(...(fs.readFileSync(path.join(from.pgdata, "postmaster.pid"), "utf8").split("\n")[6] ?? "").trim().split(/\s+/).slice(1));
      process.kill(-from.process.pid!, "SIGKILL");
      await awaitPromotion(s);
      await sleep(PHASE_MS.afterSwitch);
    }

    phase = "4 drain";
    const drained = Date.now() + 30_000;
    while (owed.length > 0 && Date.now() < drained) await sleep(100);
    stopping = true;
    await workers;
    await readinessProbe;

    // --- the answers
    const documented = (o: Outcome) => o.verdict === "200" || (o.verdict === "503 UNAVAILABLE" && o.retryAfter !== undefined) || (o.retry && o.verdict === "409 IDEMPOTENCY_IN_PROGRESS");
    const undocumented = outcomes.filter((o) => !documented(o));
    check("every answer is 200 or 503 UNAVAILABLE with Retry-After (a resent key may also meet 409 IDEMPOTENCY_IN_PROGRESS)", undocumented.length === 0, undocumented.slice(0, 5).map((o) => `${o.phase} ${o.kind}: ${o.verdict}${o.retryAfter ? "" : " (no Retry-After)"}`).join("; "));
    const late = outcomes.filter((o) => o.answeredAt - o.sentAt > CALL_DEADLINE_MS + CALL_SLACK_MS);
    check(
      "no call is answered later than its deadline",
      late.length === 0,
      `${late.length} later than ${seconds(CALL_DEADLINE_MS + CALL_SLACK_MS)}${late.slice(0, 5).map((o) => `; ${o.phase} ${o.kind}${o.retry ? " resent" : ""} ${o.verdict} after ${seconds(o.answeredAt - o.sentAt)}, ${seconds(o.sentAt - (switches.at(-1)?.lostAt ?? 0))} after the last loss`).join("")}; slowest ${seconds(Math.max(...outcomes.map((o) => o.answeredAt - o.sentAt)))}`,
    );
    check("every keyed call answered 503 was answered 200 when sent again with its key", owed.length === 0, `${owed.length} still owed`);

    // --- the money, read from the new primary through the same multi-host URI
    await until(async () => Number((await db!("requests").where({ status: "active" }).count({ n: "*" }))[0]!.n) === 0, "no active hold", 20_000);
    check("no hold is left", true);
    const rows = new Map(
      (await db("requests").whereIn("account_id", accounts.map((a) => a.id)).select("id", "status", "charged", "idempotency_key")).map((r) => [
        r.id as string,
        r as { id: string; status: string; charged: number; idempotency_key: string | null },
      ]),
    );
    const settles = new Set((await db("ledger").where({ kind: "settle" }).whereIn("account_id", accounts.map((a) => a.id)).pluck("request_id")) as string[]);
    const answered = outcomes.filter((o) => o.verdict === "200" && !o.replayed);
    const missing = answered.filter((o) => {
      const row = o.requestId ? rows.get(o.requestId) : undefined;
      return !row || row.status !== "settled" || row.charged !== o.chargedUnits || !settles.has(row.id);
    });
    check("every answered call's charge is in the new primary's ledger (settled row, its charge, a settle entry)", missing.length === 0, `${answered.length} answered; ${missing.length} missing: ${missing.slice(0, 3).map((o) => `${o.phase} ${o.requestId}`).join(", ")}`);
    const settledPerKey = new Map<string, number>();
    for (const row of rows.values()) if (row.idempotency_key && row.status === "settled") settledPerKey.set(row.idempotency_key, (settledPerKey.get(row.idempotency_key) ?? 0) + 1);
    const keys = new Set(outcomes.filter((o) => o.key).map((o) => o.key!));
    const twice = [...settledPerKey].filter(([, n]) => n > 1);
    const freshPerKey = new Map<string, number>();
    for (const o of outcomes) if (o.key && o.verdict === "200" && !o.replayed) freshPerKey.set(o.key, (freshPerKey.get(o.key) ?? 0) + 1);
    const keysAnsweredTwice = [...freshPerKey].filter(([, n]) => n > 1);
    check("no keyed call is charged twice: one settled request per key, one fresh answer per key", twice.length === 0 && keysAnsweredTwice.length === 0 && [...keys].every((k) => settledPerKey.get(k) === 1), `${keys.size} keys; settled twice ${twice.length}; answered fresh twice ${keysAnsweredTwice.length}`);
    const unanswered = [...rows.values()].filter((r) => r.status === "settled" && !answered.some((o) => o.requestId === r.id));
    check("no settled request without a 200 answer (nothing charged that was answered 503)", unanswered.length === 0, `${unanswered.length} settled without an answer`);
    const violations: string[] = [];
    for (const account of accounts) {
      try {
        await assertInvariants(db, account.id);
      } catch (err) {
        violations.push(`${account.id}: ${(err as Error).message.split("\n").slice(0, 6).join(" ")}`);
      }
    }
    check("the ledger invariants hold for every account (balance = grants − settles, holds, one final entry per request)", violations.length === 0, violations.join("\n    "));

    // --- readiness and metrics
    for (const s of switches) {
      const during = readiness.filter((r) => r.at >= s.lostAt && r.at <= (s.promotedAt ?? s.lostAt));
      const after = readiness.filter((r) => r.at > (s.promotedAt ?? 0) + 5_000 && r.at < (s.promotedAt ?? 0) + PHASE_MS.afterSwitch);
      if (s.name.includes("kill")) check(`${s.name}: /readyz says 503 while no primary answers`, during.some((r) => r.status === 503), `${during.filter((r) => r.status === 503).length} of ${during.length} probes 503 before the promotion`);
      check(`${s.name}: /readyz says 200 on both replicas once the new primary serves`, after.length > 0 && after.every((r) => r.status === 200), `${after.filter((r) => r.status !== 200).length} of ${after.length} probes not 200`);
    }
    for (let r = 0; r < replicas.length; r++) {
      const text = await (await fetch(`${replicas[r]!.url}/metrics`)).text();
      const changes = Number(/^typesafe_db_primary_changes_total (\S+)$/m.exec(text)?.[1]);
      const current = /^typesafe_db_primary\{node="([^"]+)"\} 1$/m.exec(text)?.[1];
      const last = switches.at(-1)!.to;
      check(`replica ${r + 1}'s metrics show the primary changes and the current node`, changes >= switches.length && current === `127.0.0.1:${last.port}`, `typesafe_db_primary_changes_total ${changes}, current ${current}`);
    }

    // --- the background workers: failures while no primary answers, none once the last new primary serves
    const workerFailures = replicas.flatMap((replica) =>
      replica.logs.flatMap((line) => {
        const entry = /^\{/.test(line) ? (JSON.parse(line) as { time?: string; msg?: string }) : undefined;
        return entry?.msg && BACKGROUND_FAILURES.includes(entry.msg) ? [{ at: Date.parse(entry.time ?? ""), msg: entry.msg }] : [];
      }),
    );
    const settledAt = (switches.at(-1)!.promotedAt ?? 0) + 3_000;
    const lingering = workerFailures.filter((f) => f.at > settledAt);
    check(
      "the hold sweeper, usage roll-up, key-expiry watch and webhook deliverer carry on from the new primary (no failure logged 3 s after the promotion)",
      lingering.length === 0,
      `${workerFailures.length} failed rounds during the switches (${[...new Set(workerFailures.map((f) => f.msg))].join(", ") || "none"}); ${lingering.length} after: ${lingering.slice(0, 3).map((f) => f.msg).join(", ")}`,
    );

    // --- the figures
    process.stdout.write("\nswitch                       loss→promoted  loss→served  promoted→served   calls  200  503  other  (sent from the loss to 5 s after the promotion)\n");
    for (const s of switches) {
      const window = outcomes.filter((o) => o.sentAt >= s.lostAt && o.sentAt <= (s.promotedAt ?? s.lostAt) + 5_000);
      const lastFailure = Math.max(s.lostAt, ...window.filter((o) => o.verdict !== "200" && !o.retry).map((o) => o.answeredAt));
      const served = outcomes.filter((o) => o.verdict === "200" && o.answeredAt >= lastFailure && o.sentAt >= s.lostAt).map((o) => o.answeredAt);
      const servedAt = served.length > 0 ? Math.min(...served) : undefined;
      const by = (v: (o: Outcome) => boolean) => String(window.filter(v).length);
      process.stdout.write(
        `${s.name.padEnd(29)}${seconds((s.promotedAt ?? NaN) - s.lostAt).padStart(13)}${(servedAt ? seconds(servedAt - s.lostAt) : "never").padStart(13)}${(servedAt ? seconds(servedAt - (s.promotedAt ?? 0)) : "never").padStart(17)}` +
          `${String(window.length).padStart(8)}${by((o) => o.verdict === "200").padStart(5)}${by((o) => o.verdict.startsWith("503")).padStart(5)}${by((o) => o.verdict !== "200" && !o.verdict.startsWith("503")).padStart(7)}\n`,
      );
      check(`${s.name}: calls are served again within 10 s of the promotion`, servedAt !== undefined && servedAt - (s.promotedAt ?? 0) <= 10_000);
    }
    const retried = outcomes.filter((o) => o.retry);
    process.stdout.write(
      `\ncalls: ${outcomes.length} (${outcomes.filter((o) => o.kind === "decide").length} decisions, ${outcomes.filter((o) => o.kind === "search").length} searches; ` +
        `${outcomes.filter((o) => o.key).length} with a key, ${retried.length} of them resent after a 503: ${retried.filter((o) => o.verdict === "200").length} answered, ${retried.filter((o) => o.replayed).length} as a replay)\n`,
    );
    const balances = await db("accounts").whereIn("id", accounts.map((a) => a.id)).sum({ units: "balance" }).first();
    const granted = await db("ledger").whereIn("account_id", accounts.map((a) => a.id)).where({ kind: "grant" }).sum({ units: "amount" }).first();
    const charged = await db("ledger").whereIn("account_id", accounts.map((a) => a.id)).where({ kind: "settle" }).sum({ units: "amount" }).first();
    process.stdout.write(
      `money: balances ${Number(balances?.units)} units = grants ${Number(granted?.units)} − settles ${Number(charged?.units)}; ${rows.size} request rows, ${settles.size} settled; invariant failures ${violations.length}\n`,
    );
    if (undocumented.length > 0 || missing.length > 0) {
      for (const replica of replicas) for (const line of replica.logs.filter((l) => /"level":"(warn|error)"/.test(l)).slice(0, 6)) process.stdout.write(`  logged: ${line.slice(0, 400)}\n`);
    }
  } catch (err) {
    check("the run completes", false, err instanceof Error ? err.message : String(err));
  } finally {
    await db?.destroy();
    await Promise.all(replicas.map((r) => r.stop("SIGTERM")));
    await llm.close();
    await search.close();
    await stopFormation(tmp);
    fs.rmSync(tmp, { recursive: true, force: true, maxRetries: 5 });
    tmp = undefined;
    process.stdout.write(checks.report(startedAt));
    process.exitCode = checks.exitCode();
  }
}

function decisionBody(marker: string): object {
  return {
    model: "typesafe/service-1.13",
    state: { ticket: `failover case ${marker}` },
    questions: { urgent: { type: "noul", instructions: "Is this urgent?" } },
  };
}

/**
 * Stops every node still running (`pg_autoctl stop --immediate`: postgres
 * quits at once and removes its shared memory), then kills what is left of
 * each process group the run started.
 */
async function stopFormation(folder: string): Promise<void> {
  const running = nodes.filter((n) => n.process.exitCode === null && n.process.signalCode === null);
  await Promise.all(running.map((n) => autoctl(folder, ["stop", "--pgdata", n.pgdata, "--immediate"]).catch(() => "")));
  await Promise.race([Promise.all(running.map((n) => n.exited)), sleep(10_000)]);
  for (const node of nodes) {
    try {
      process.kill(-node.process.pid!, "SIGKILL");
    } catch {
      // the group is gone already
    }
  }
  for (const id of orphanSegments.filter((s) => /^[0-9]+$/.test(s))) spawnSync("ipcrm", ["-m", id]);
}

/** System V shared memory ids of the postgres processes killed with -9. */
const orphanSegments: string[] = [];

/** The formation's nodes as started, and the temporary folder: both cleaned up on every way out. */
const nodes: Node[] = [];
let tmp: string | undefined;

runWithHardLimit("failover", HARD_LIMIT_MS, main, () => {
  for (const node of nodes) {
    try {
      process.kill(-node.process.pid!, "SIGKILL");
    } catch {
      // gone
    }
  }
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});
