/**
 * npm run chaos [-- --seconds 120 --seed 7]
 *
 * Money and availability under real faults, as an operator would run them:
 * two replicas of the service (each its own process), a fake OpenAI-compatible
 * upstream that fails and stalls some calls, clients that abort and retry with
 * Idempotency-Keys, a TCP proxy between the replicas and PostgreSQL that loses
 * requests, loses replies after the statement committed, stalls replies and
 * holds admissions back (up to 1.5 s, past their 1 s deadline or not),
 * `kill -9` of a replica, a cut of every database connection, and a crash of
 * PostgreSQL (`pg_ctl stop -m immediate` and a start with WAL recovery, on a
 * private throwaway cluster, where initdb is available).
 *
 * Afterwards it checks the ledger invariants of every account and that every
 * answer a client saw agrees with the ledger: a 200's billing equals its row,
 * an error was never charged, and no admission that arrived after its call
 * abandoned it holds anything. Every account also has balance thresholds, a
 * webhook endpoint at a receiver that fails or hangs some deliveries, and
 * grants now and then: its balance events must alternate (a threshold's low,
 * then its recovery, never two lows), agree with the crossed state on its row,
 * and each reach the receiver, verified, with one webhook-id per event and in
 * order per endpoint; nothing lost, nothing invented. The last line names the
 * calls, the faults and the violations; the exit code is 1 when there is any
 * violation.
 * Loopback only, bounded in time, seeded.
 */
import { spawn, type ChildProcess } from "node:child_process";
import path from "node:path";
import { parseArgs } from "node:util";
import { createApiKey } from "../../src/keys/store.js";
import { createAccount, grant } from "../../src/admin/account-funding.js";
import { DECISION_RESERVE_UNITS_PER_QUESTION } from "../../src/metering/meter.js";
import { addEndpoint } from "../../src/webhooks/endpoints.js";
import { setAlertSettings } from "../../src/webhooks/events.js";
import { startWebhookReceiver } from "../support/webhook-receiver.js";
import { createKnex, migrate } from "../../src/db/database.js";
import { isProbe, logprobsReply, PROBE_OK, startFakeLlm } from "../support/fake-llm.js";
import { assertInvariants } from "../support/invariants.js";
import { startPrivateCluster, type PrivateCluster } from "../support/private-cluster.js";
import { proxiedUrl, startTcpProxy, type Fault } from "../support/tcp-proxy.js";

const { values } = parseArgs({ options: { seconds: { type: "string", default: "90" }, seed: { type: "string", default: "1" } } });
const SECONDS = Math.min(Math.max(Number(values.seconds), 10), 280);
const ROOT = path.resolve(import.meta.dirname, "../..");
const WORKERS = 10;
const ACCOUNTS = 20;
/** The budget of the budgeted keys: one 32,000-unit hold at a time, and an end after a few dozen charges. */
const KEY_BUDGET_UNITS = 40_000;

let seed = (Number(values.seed) * 2_654_435_761) >>> 0 || 1;
/** xorshift32: the same choices for the same seed. */
function random(): number {
  seed ^= seed << 13;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  return (seed >>> 0) / 2 ** 32;
}
const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)]!;

const counts = { upstream500: 0, kill9: 0, pgCrash: "skipped" as string, cutAll: 0, grants: 0, webhook500: 0, webhookHung: 0 };
const START_UNITS = 200 * 1_000_000;
/** Just below the opening balance, so a few calls cross the first and a few dozen the second. */
const THRESHOLDS = [START_UNITS - 1_000, START_UNITS - 8_000];

/** A private cluster where initdb is available, so crashing it disturbs nobody else; undefined elsewhere. */
async function startChaosCluster(): Promise<PrivateCluster | undefined> {
  try {
    return await startPrivateCluster();
  } catch (err) {
    process.stderr.write(`chaos: no private cluster (${(err as Error).message.split("\n")[0]}); PostgreSQL crash skipped\n`);
    return undefined;
  }
}

interface Replica {
  child: ChildProcess;
  url: string;
  /** Its last log lines, printed when it does not stop. */
  lastLines: string[];
}

/** One replica as its own node process (no wrapper), so kill -9 kills the server itself. */
function startReplica(env: Record<string, string>): Promise<Replica> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", "tsx", "src/main.ts"], {
      cwd: ROOT,
      env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "", PORT: "0", TYPESAFE_SEARCH_SOURCES: "none", TYPESAFE_LLM_EMBEDDED: "off", ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let buffered = "";
    const lastLines: string[] = [];
    child.stdout!.on("data", (chunk: Buffer) => {
      buffered += chunk.toString();
      const lines = buffered.split("\n");
      buffered = lines.pop()!;
      for (const line of lines) {
        lastLines.push(line);
        if (lastLines.length > 30) lastLines.shift();
        if (line.includes('"msg":"listening"')) resolve({ child, url: String(JSON.parse(line).url), lastLines });
      }
    });
    child.stderr!.on("data", (chunk: Buffer) => process.stderr.write(chunk));
    child.on("exit", (code) => reject(new Error(`replica exited with ${code} before listening`)));
  });
}

interface Outcome {
  status: number | "aborted" | "transport";
  requestId?: string;
  chargedUnits?: number;
  billingUnknown?: boolean;
  reason?: string;
}

function decision(): string {
  const questions = Object.fromEntries(
    Array.from({ length: 1 + Math.floor(random() * 3) }, (_, i) => [`q${i}`, { type: "noul", instructions: `Is aspect ${i} urgent?` }]),
  );
  return JSON.stringify({ model: "typesafe/service-1.13", state: { ticket: `case ${Math.floor(random() * 1e6)}` }, questions });
}

async function post(url: string, apiKey: string, body: string, idempotencyKey: string | undefined, abortAfterMs: number | undefined): Promise<Outcome> {
  try {
    const response = await fetch(`${url}/api/v1/decisions`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        authorization: `Bearer ${apiKey}`,
        ...(idempotencyKey ? { "idempotency-key": idempotencyKey } : {}),
      },
      body,
      signal: abortAfterMs === undefined ? AbortSignal.timeout(30_000) : AbortSignal.timeout(abortAfterMs),
    });
    const envelope = (await response.json()) as { data?: Record<string, unknown> };
    const data = envelope.data ?? {};
    const billing = data["billing"] as { charged_credits?: number; request_id?: string } | undefined;
    const metadata = data["metadata"] as Record<string, string> | undefined;
    return {
      status: response.status,
      requestId: billing?.request_id ?? (data["request_id"] as string | undefined),
      chargedUnits: billing?.charged_credits === undefined ? undefined : Math.round(billing.charged_credits * 1_000_000),
      billingUnknown: metadata?.["billing"] === "unknown",
      reason: data["reason"] as string | undefined,
    };
  } catch (err) {
    return { status: (err as Error).name === "TimeoutError" && abortAfterMs !== undefined ? "aborted" : "transport" };
  }
}

/**
 * The balance events of every account against its row and the receiver: per
 * threshold low and recovered alternate, starting with low, and the last one
 * agrees with the crossed state; depleted and its end alternate likewise;
 * every event was delivered, each delivery reached the receiver verified, no
 * webhook-id arrived that no event has, and each endpoint first heard its
 * events in the order they were recorded; each budgeted key short of a
 * call's reservation was told so once, and no other key. Returns the number
 * of events.
 */
async function checkEvents(
  db: ReturnType<typeof createKnex>,
  accounts: { id: string }[],
  receiver: Awaited<ReturnType<typeof startWebhookReceiver>>,
  violations: string[],
): Promise<number> {
  const events = await db("account_events").whereIn("account_id", accounts.map((a) => a.id)).orderBy("id");
  const byWebhookId = new Map(events.map((e) => [e.webhook_id as string, e]));
  for (const account of accounts) {
    const row = await db("accounts").where({ id: account.id }).first("alert_crossed", "alert_depleted");
    const crossed = new Set<number>();
    let depleted = false;
    for (const event of events.filter((e) => e.account_id === account.id)) {
      if (event.type === "balance.low") {
        const t = Number(event.data.threshold_units);
        if (crossed.has(t)) violations.push(`${account.id}: a second balance.low for ${t} before its recovery (event ${event.id})`);
        crossed.add(t);
      } else if (event.type === "balance.recovered") {
        for (const t of (event.data.thresholds_units as number[]).map(Number)) {
          if (!crossed.delete(t)) violations.push(`${account.id}: balance.recovered for ${t}, which was not crossed (event ${event.id})`);
        }
        if (event.data.depleted_ended) {
          if (!depleted) violations.push(`${account.id}: a depletion ended that had not begun (event ${event.id})`);
          depleted = false;
        }
      } else if (event.type === "balance.depleted") {
        if (depleted) violations.push(`${account.id}: a second balance.depleted (event ${event.id})`);
        depleted = true;
      }
    }
    const onRow = new Set((row.alert_crossed as string[]).map(Number));
    if ([...crossed].sort().join() !== [...onRow].sort().join() || depleted !== row.alert_depleted) {
      violations.push(`${account.id}: events say crossed [${[...crossed]}] depleted ${depleted}, the row says [${[...onRow]}] ${row.alert_depleted}`);
    }
  }
  // Budgets here are totals, never raised: a key short of a call's reservation was told once, and a key that is not, never.
  const keys = await db("api_keys").whereIn("account_id", accounts.map((a) => a.id)).whereNotNull("budget_units").select("id", "budget_units", "budget_spent");
  for (const key of keys) {
    const told = events.filter((e) => e.type === "key.budget_reached" && e.data.key_id === key.id).length;
    const short = Number(key.budget_units) - Number(key.budget_spent) < DECISION_RESERVE_UNITS_PER_QUESTION;
    if (told !== (short ? 1 : 0)) violations.push(`key ${key.id}: ${told} key.budget_reached events, its budget is ${short ? "" : "not "}short of a call`);
  }
  const undelivered = await db("webhook_deliveries").whereIn("event_id", events.map((e) => e.id)).whereNot({ state: "delivered" }).pluck("id");
  for (const id of undelivered) violations.push(`delivery ${id} was not delivered`);
  const firstSeen = new Map<string, number>();
  for (const [i, request] of receiver.received.entries()) {
    if (!byWebhookId.has(request.webhookId)) violations.push(`the receiver got ${request.webhookId}, which no event has`);
    if (request.verifiedWith.length !== 1) violations.push(`${request.webhookId} did not verify`);
    if (!firstSeen.has(request.webhookId)) firstSeen.set(request.webhookId, i);
  }
  for (const event of events) if (!firstSeen.has(event.webhook_id)) violations.push(`event ${event.id} (${event.type}) never reached the receiver`);
  for (const account of accounts) {
    const order = events.filter((e) => e.account_id === account.id && firstSeen.has(e.webhook_id)).map((e) => firstSeen.get(e.webhook_id)!);
    if (order.some((at, i) => i > 0 && at < order[i - 1]!)) violations.push(`${account.id}: its endpoint heard its events out of order`);
  }
  return events.length;
}

async function main(): Promise<void> {
  const cluster = await startChaosCluster();
  const directUrl = cluster?.url ?? process.env.DATABASE_URL;
  if (!directUrl) throw new Error("chaos needs initdb (a private cluster) or DATABASE_URL");
  const dbName = `typesafe_chaos_${process.pid}`;
  const admin = createKnex(directUrl, 1);
  await admin.raw(`CREATE DATABASE ${dbName}`);
  await admin.destroy();
  const url = new URL(directUrl);
  url.pathname = `/${dbName}`;
  const databaseUrl = url.toString();

  const proxy = await startTcpProxy({ host: "127.0.0.1", port: Number(url.port) }, (chunk) => {
    const text = chunk.toString("latin1");
    if (!text.includes("metering_")) return "pass";
    const roll = random();
    const fault: Fault = roll < 0.02 ? "lose-reply" : roll < 0.03 ? "lose-request" : roll < 0.035 ? "stall-reply" : "pass";
    // Delivered up to 1.5 s later: before or after its 1 s deadline, and before or after its call's abandon.
    if (fault === "pass" && roll < 0.045 && text.includes("metering_admit")) return "hold-request";
    return fault;
  });
  // OpenAI's 500 body (platform.openai.com/docs/guides/error-codes: "500 - The server had an error while processing your request").
  const upstream = await startFakeLlm((request) => {
    if (isProbe(request.body)) return PROBE_OK;
    const roll = random();
    if (roll < 0.2) {
      counts.upstream500++;
      return { status: 500, json: { error: { message: "The server had an error while processing your request. Sorry about that!", type: "server_error", param: null, code: null } } };
    }
    return { ...logprobsReply({ yes: 0.7, no: 0.3 }, { prompt: 150 + Math.floor(roll * 100) }), delayMs: roll < 0.3 ? 50 + Math.floor(roll * 1000) : 0 };
  });

  const replicaEnv = {
    DATABASE_URL: proxiedUrl(databaseUrl, proxy),
    TYPESAFE_LLM_BASE_URL: `${upstream.url}/v1`,
    TYPESAFE_LLM_REQUEST_TIMEOUT_MS: "8000",
    TYPESAFE_DB_STATEMENT_TIMEOUT_MS: "1000",
    TYPESAFE_LEASE_MARGIN_MS: "2000",
    TYPESAFE_SWEEP_INTERVAL_MS: "500",
    TYPESAFE_SHUTDOWN_GRACE_MS: "3000",
    TYPESAFE_WEBHOOK_ALLOW_LOOPBACK: "on",
    TYPESAFE_WEBHOOK_POLL_MS: "100",
    TYPESAFE_WEBHOOK_TIMEOUT_MS: "1000",
    TYPESAFE_WEBHOOK_RETRY_DELAYS_MS: "100,200,400,800,1000,1000,1000,1000,1000",
  };
  // A receiver that answers 500 to some deliveries and never answers a few.
  const receiver = await startWebhookReceiver();
  receiver.answer = () => {
    const roll = random();
    if (roll < 0.1) {
      counts.webhook500++;
      return 500;
    }
    if (roll < 0.12) {
      counts.webhookHung++;
      return "hang";
    }
    return 200;
  };
  // Migrated directly, not through the faulty proxy: the faults are meant for the calls' statements, and a
  // migration's text names the metering functions too.
  const migrator = createKnex(databaseUrl, 2);
  await migrate(migrator, { useAdvisoryLock: true });
  await migrator.destroy();
  const replicas = [await startReplica(replicaEnv), await startReplica(replicaEnv)];

  const db = createKnex(databaseUrl, 4);
  const accounts: { id: string; apiKey: string }[] = [];
  for (let i = 0; i < ACCOUNTS; i++) {
    const account = await createAccount(db, { name: `chaos-${i}`, units: START_UNITS, freeRequests: 5 });
    await db("accounts").where({ id: account.id }).update({ rate_limit: 1_000 });
    await setAlertSettings(db, account.id, THRESHOLDS, DECISION_RESERVE_UNITS_PER_QUESTION);
    const endpoint = await addEndpoint(db, account.id, `${receiver.url}/${i}`, { actor: "chaos", at: new Date() });
    receiver.secrets.push(endpoint!.secret);
    const key = await createApiKey(db, account.id);
    // Half the keys have a budget that one hold fills most of: calls racing for it, and its end, are part of the run.
    if (i % 2 === 0) await db("api_keys").where({ id: key.keyId }).update({ budget_units: KEY_BUDGET_UNITS, budget_period: "total" });
    accounts.push({ id: account.id, apiKey: key.apiKey });
  }

  const outcomes: Outcome[] = [];
  const deadline = Date.now() + SECONDS * 1000;
  const faultsDone = new Set<string>();
  const at = (fraction: number) => Date.now() >= deadline - SECONDS * 1000 * (1 - fraction);
  let nextDelivery = Date.now() + 1_500;
  async function faultTimeline(): Promise<void> {
    while (Date.now() < deadline) {
      if (at(0.3) && !faultsDone.has("kill")) {
        faultsDone.add("kill");
        replicas[1]!.child.kill("SIGKILL");
        counts.kill9++;
        replicas[1] = await startReplica(replicaEnv);
      }
      if (at(0.55) && !faultsDone.has("crash") && cluster) {
        faultsDone.add("crash");
        cluster.crash();
        counts.pgCrash = "1";
      }
      if (at(0.75) && !faultsDone.has("cut")) {
        faultsDone.add("cut");
        proxy.cutAll();
        counts.cutAll++;
      }
      if (Date.now() >= nextDelivery) {
        nextDelivery = Date.now() + 1_500;
        void proxy.deliverHeld();
        // A grant now and then brings an account back above its thresholds: balance.recovered.
        const account = pick(accounts);
        await grant(db, account.id, 4_000 + Math.floor(random() * 6_000), 0).then(
          () => counts.grants++,
          () => undefined,
        );
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  async function worker(): Promise<void> {
    while (Date.now() < deadline) {
      const account = pick(accounts);
      const body = decision();
      const key = random() < 0.3 ? `chaos-${Math.floor(random() * 1e12)}` : undefined;
      for (let attempt = 0; attempt < (key ? 3 : 1); attempt++) {
        const abortAfterMs = random() < 0.1 ? 5 + Math.floor(random() * 300) : undefined;
        const outcome = await post(pick(replicas).url, account.apiKey, body, key, abortAfterMs);
        outcomes.push(outcome);
        if (typeof outcome.status === "number" && outcome.status < 500) break;
      }
    }
  }

  await Promise.all([faultTimeline(), ...Array.from({ length: WORKERS }, worker)]);
  await proxy.deliverHeld();
  // Every event recorded is delivered before the replicas stop (retries are short here).
  const drainBy = Date.now() + 60_000;
  while (Date.now() < drainBy && Number((await db("webhook_deliveries").where({ state: "pending" }).count({ n: "*" }))[0]!.n) > 0) {
    await new Promise((r) => setTimeout(r, 250));
  }
  let hungReplicas = 0;
  await Promise.all(
    replicas.map(async (replica) => {
      if (replica.child.exitCode !== null || replica.child.signalCode !== null) return;
      const exited = new Promise((done) => replica.child.once("exit", done));
      replica.child.kill("SIGTERM");
      // A replica that does not drain within its grace period (3 s) and a margin is a finding too.
      const timer = setTimeout(() => {
        hungReplicas++;
        process.stderr.write(`chaos: a replica did not stop; its last log lines:\n${replica.lastLines.join("\n")}\n`);
        replica.child.kill("SIGKILL");
      }, 15_000);
      await exited;
      clearTimeout(timer);
    }),
  );
  // Holds of the killed replica return at their lease: sweep as of a day later.
  await db.raw("SELECT metering_sweep(now() + interval '1 day', 100000)");

  const violations: string[] = [];
  for (const account of accounts) {
    try {
      await assertInvariants(db, account.id);
    } catch (err) {
      violations.push(`invariants of ${account.id}: ${(err as Error).message.split("\n")[0]}`);
    }
  }
  // An admission that arrived after its call abandoned it must have rolled itself back.
  const heldAfterAbandon = await db("requests").join("abandoned_admissions", "abandoned_admissions.request_id", "requests.id").pluck("requests.id");
  for (const id of heldAfterAbandon) violations.push(`request ${id} was abandoned by its call, yet its admission holds a row`);
  const abandoned = Number((await db("abandoned_admissions").count({ n: "*" }))[0]!.n);
  const rows = new Map((await db("requests").select("id", "status", "charged")).map((r) => [r.id as string, r]));
  let unknown = 0;
  for (const outcome of outcomes) {
    if (typeof outcome.status !== "number" || outcome.requestId === undefined) continue;
    const row = rows.get(outcome.requestId);
    if (outcome.status === 200) {
      if (row?.status !== "settled" || Number(row.charged) !== outcome.chargedUnits) {
        violations.push(`200 ${outcome.requestId} shows ${outcome.chargedUnits} units, its row ${JSON.stringify(row)}`);
      }
    } else if (outcome.billingUnknown) {
      unknown++;
    } else if (row?.status === "settled") {
      violations.push(`${outcome.status} ${outcome.requestId} was answered as an error but its row is settled (charged ${row.charged})`);
    }
  }
  // No key was charged past its budget (also in the invariants as I8; counted here for the summary line).
  const overBudget = await db.raw<{ rows: { key_id: string; charged: number }[] }>(
    `SELECT k.id AS key_id, sum(r.charged)::bigint AS charged FROM api_keys k JOIN requests r ON r.key_id = k.id AND r.status = 'settled'
      WHERE k.budget_units IS NOT NULL GROUP BY k.id, k.budget_units HAVING sum(r.charged) > k.budget_units`,
  );
  for (const key of overBudget.rows) violations.push(`key ${key.key_id} was charged ${key.charged} units, past its budget of ${KEY_BUDGET_UNITS}`);
  const budgetRefusals = outcomes.filter((o) => o.reason === "KEY_BUDGET_EXCEEDED").length;
  if (hungReplicas > 0) violations.push(`${hungReplicas} replica(s) did not stop within 15 s of SIGTERM`);
  const events = await checkEvents(db, accounts, receiver, violations);
  for (const v of violations.slice(0, 20)) process.stdout.write(`violation: ${v}\n`);

  await db.destroy();
  await receiver.close();
  await proxy.close();
  await upstream.close();
  const drop = createKnex(directUrl, 1);
  await drop.raw(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
  await drop.destroy();
  cluster?.stop();

  const byStatus = new Map<string, number>();
  for (const o of outcomes) byStatus.set(String(o.status), (byStatus.get(String(o.status)) ?? 0) + 1);
  const statuses = [...byStatus].sort().map(([s, n]) => `${s}=${n}`).join(" ");
  process.stdout.write(
    `chaos: ${outcomes.length} calls in ${SECONDS} s (${statuses}; billing unknown=${unknown}) · faults: ` +
      `lose-reply=${proxy.faults["lose-reply"]} lose-request=${proxy.faults["lose-request"]} stall-reply=${proxy.faults["stall-reply"]} ` +
      `hold-request=${proxy.faults["hold-request"]} (abandoned before arriving: ${abandoned}) ` +
      `upstream-500=${counts.upstream500} kill-9=${counts.kill9} cut-all=${counts.cutAll} pg-crash=${counts.pgCrash} · ` +
      `key budgets: ${Math.ceil(ACCOUNTS / 2)} keys, ${budgetRefusals} calls refused KEY_BUDGET_EXCEEDED, ${overBudget.rows.length} keys over budget · ` +
      `events=${events} (grants=${counts.grants}; webhook 500=${counts.webhook500} hung=${counts.webhookHung}) · violations=${violations.length}\n`,
  );
  process.exit(violations.length > 0 ? 1 : 0);
}

// The whole run is bounded: load, faults, then at most two minutes of shutdown and checks.
setTimeout(() => {
  process.stderr.write("chaos: the harness did not finish in time\n");
  process.exit(2);
}, (SECONDS + 120) * 1000).unref();

main().catch((err: unknown) => {
  process.stderr.write(`chaos failed: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(2);
});
