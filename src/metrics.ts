import type { Knex } from "knex";
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import { primaryStateOf } from "./db/primary-client.js";
import type { Meter, MeterStats } from "./metering/meter.js";

/**
 * Prometheus metrics of one service process (prom-client), served at GET
 * /metrics on the service port without a key. Labels are bounded by
 * construction: procedures are our own RPC names (anything else is "other"),
 * protocols one of five names; no label ever holds an account, key or query.
 */
export interface Metrics {
  registry: Registry;
  /** One finished call: its reason ("OK" on success) and duration. */
  recordCall(procedure: string, protocol: string, reason: string, seconds: number): void;
  /** One HTTP call to the upstream LLM: ok, rejected (4xx), failed (5xx, transport), timeout or aborted. */
  recordLlmCall(outcome: LlmCallOutcome, seconds: number): void;
  /** One decided request: the tokens it was charged for and how each question was answered. */
  recordDecision(tokens: { input: number; cachedInput: number; output: number }, methods: string[]): void;
  /** One search source's part in a search: its reported status, latency and whether the cache answered. */
  recordSearchSource(source: string, status: string, seconds: number, cached: boolean): void;
  /** Results of one source that typesafe's own filter check dropped, by filter (`d`, `xd`, `l`, `c`). */
  recordSearchFilterDrops(source: string, dropped: Partial<Record<string, number>>): void;
  /** Where each scrape reads how many client connections are open. */
  observeOpenConnections(count: () => number): void;
  /** One client connection (or HTTP/2 stream) closed because it outlived one of the server's timeouts. */
  recordConnectionTimeout(timeout: ConnectionTimeout): void;
  /** One client connection closed on accept because the server held as many as it may. */
  recordConnectionRefused(): void;
  /** One sign-in to the account area: ok, failed (wrong email or password) or throttled. */
  recordSignIn(outcome: SignInOutcome): void;
}

const SIGN_IN_OUTCOMES = ["ok", "failed", "throttled"] as const;
export type SignInOutcome = (typeof SIGN_IN_OUTCOMES)[number];

/** Bound label children of recordCall kept per raw procedure, protocol and reason. */
const MAX_CACHED_CALL_SERIES = 256;

const LLM_CALL_OUTCOMES = ["ok", "rejected", "failed", "timeout", "aborted"] as const;
/** How one HTTP call to the upstream LLM ended. */
export type LlmCallOutcome = (typeof LLM_CALL_OUTCOMES)[number];

const CONNECTION_TIMEOUTS = ["headers", "body", "idle", "linger"] as const;
/** The timeout that closed a connection: request head (or first HTTP/2 stream), request body, idleness, or a body still arriving long after its answer. */
export type ConnectionTimeout = (typeof CONNECTION_TIMEOUTS)[number];

const METER_COUNTERS: [Exclude<keyof MeterStats, "holdsInFlight">, string, string][] = [
  ["settles", "typesafe_meter_settles_total", "Calls settled: charged their actual cost or used their free request."],
  ["releases", "typesafe_meter_releases_total", "Holds given back after a failed call."],
  ["holdsExpired", "typesafe_meter_holds_expired_total", "Holds released by lease expiry (this replica's sweeper)."],
  ["lateSettles", "typesafe_meter_late_settles_total", "Work finished after its hold expired: answered as an error, not billed."],
  ["settleFailures", "typesafe_meter_settle_failures_total", "Settles that could not be recorded (answered 503; the lease releases the hold)."],
  ["releaseFailures", "typesafe_meter_release_failures_total", "Releases that could not be recorded (the lease releases the hold)."],
  ["admissionsAbandoned", "typesafe_meter_admissions_abandoned_total", "Admissions given up before they reached the database (slower than the statement deadline); a late one rolls itself back."],
  ["cappedCharges", "typesafe_meter_capped_charges_total", "Actual costs above the reservation, charged at the reservation."],
];

/** The registry and its recorders; the meter's and the pool's figures are read at scrape time. */
export function createMetrics(deps: {
  meter: Meter;
  db: Knex;
  /** Account-area sessions live now, read from the database at scrape time. */
  liveSessions?: () => Promise<number>;
  /** Tokens the embedded model has evaluated since it loaded (undefined while none is loaded). */
  embeddedTokensEvaluated?: () => number | undefined;
}): Metrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });

  const calls = new Counter({
    name: "typesafe_calls_total",
    help: "Finished calls by procedure, protocol and reason (OK on success).",
    labelNames: ["procedure", "protocol", "reason"] as const,
    registers: [registry],
  });
  const callSeconds = new Histogram({
    name: "typesafe_call_duration_seconds",
    help: "Call latency from the first byte of the request to the answer, by procedure and protocol.",
    labelNames: ["procedure", "protocol"] as const,
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: [registry],
  });

  const llmCalls = new Counter({
    name: "typesafe_llm_calls_total",
    help: "HTTP calls to the upstream LLM (probes and retries included) by outcome.",
    labelNames: ["outcome"] as const,
    registers: [registry],
  });
  const llmSeconds = new Histogram({
    name: "typesafe_llm_call_duration_seconds",
    help: "Latency of each HTTP call to the upstream LLM.",
    buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
    registers: [registry],
  });
  const llmTokens = new Counter({
    name: "typesafe_llm_tokens_total",
    help: "Tokens of answered decisions by kind: input (cached included), cached_input, output.",
    labelNames: ["kind"] as const,
    registers: [registry],
  });
  const { embeddedTokensEvaluated } = deps;
  new Counter({
    name: "typesafe_embedded_model_tokens_evaluated_total",
    help: "Tokens the embedded model ran through llama.cpp: prompt tokens it did not already hold, and label continuations.",
    registers: [registry],
    collect() {
      const count = embeddedTokensEvaluated?.();
      if (count === undefined) return;
      this.reset();
      this.inc(count);
    },
  });
  const decisionAnswers = new Counter({
    name: "typesafe_decision_answers_total",
    help: "Answered questions by method: logprobs, verbalized (the fallback), or error.",
    labelNames: ["method"] as const,
    registers: [registry],
  });
  const searchSources = new Counter({
    name: "typesafe_search_source_results_total",
    help: "Search sources' parts in searches by source and reported status.",
    labelNames: ["source", "status"] as const,
    registers: [registry],
  });
  const searchSeconds = new Histogram({
    name: "typesafe_search_source_duration_seconds",
    help: "Latency of each search source's part, cache hits included.",
    labelNames: ["source"] as const,
    buckets: [0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers: [registry],
  });
  const searchFilterDrops = new Counter({
    name: "typesafe_search_filter_dropped_total",
    help: "Search results dropped by typesafe's own check of a filter (d, xd, l, c), by source: after a native filter, leaks caught.",
    labelNames: ["source", "filter"] as const,
    registers: [registry],
  });
  const searchCacheHits = new Counter({
    name: "typesafe_search_cache_hits_total",
    help: "Search source answers served from the cache, by source.",
    labelNames: ["source"] as const,
    registers: [registry],
  });

  for (const [stat, name, help] of METER_COUNTERS) {
    new Counter({
      name,
      help,
      registers: [registry],
      // The meter keeps the running totals; a scrape copies them.
      collect() {
        this.reset();
        this.inc(deps.meter.stats()[stat]);
      },
    });
  }

  new Gauge({
    name: "typesafe_meter_holds_in_flight",
    help: "Holds this replica has open: calls admitted and not yet settled or released.",
    registers: [registry],
    collect() {
      this.set(deps.meter.stats().holdsInFlight);
    },
  });

  const queryDuration = new Histogram({
    name: "typesafe_db_query_duration_seconds",
    help: "Database statements by outcome (ok, error), from send to answer.",
    labelNames: ["outcome"] as const,
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [registry],
  });
  // Label children bound once: an observation is then an array update, with no label hashing per call.
  const queryOutcomes = { ok: queryDuration.labels({ outcome: "ok" }), error: queryDuration.labels({ outcome: "error" }) };
  observeQueries(deps.db, (outcome, seconds) => queryOutcomes[outcome].observe(seconds));

  new Gauge({
    name: "typesafe_db_pool_connections",
    help: "Database pool connections: used, free, and acquisitions waiting for one.",
    labelNames: ["state"] as const,
    registers: [registry],
    collect() {
      const pool = (deps.db.client as { pool?: TarnPool }).pool;
      if (!pool) return;
      this.set({ state: "used" }, pool.numUsed());
      this.set({ state: "free" }, pool.numFree());
      this.set({ state: "pending" }, pool.numPendingAcquires());
    },
  });

  const primary = primaryStateOf(deps.db);
  if (primary) {
    new Counter({
      name: "typesafe_db_primary_changes_total",
      help: "Times this replica's new database connections reached another node than before: a failover or switchover seen from here.",
      registers: [registry],
      collect() {
        this.reset();
        this.inc(primary.changes);
      },
    });
    new Gauge({
      name: "typesafe_db_primary",
      help: "1 for the node (host:port of DATABASE_URL) this replica's connections last reached as the primary, 0 for the URL's other nodes.",
      labelNames: ["node"] as const,
      registers: [registry],
      collect() {
        for (const node of primary.nodes) this.set({ node }, node === primary.node ? 1 : 0);
      },
    });
  }

  let openConnections: () => number = () => 0;
  new Gauge({
    name: "typesafe_connections_open",
    help: "Client connections open on the service port, HTTP/1.1 and HTTP/2, including ones not yet past their first request.",
    registers: [registry],
    collect() {
      this.set(openConnections());
    },
  });
  const connectionTimeouts = new Counter({
    name: "typesafe_connections_timed_out_total",
    help: "Client connections closed by a timeout: headers (no whole request head, or no HTTP/2 stream, in time), body (a request body stopped arriving; on HTTP/2 the stream is reset), idle (nothing in progress for too long), linger (a request body still arriving long after its answer).",
    labelNames: ["timeout"] as const,
    registers: [registry],
  });
  const timeoutCounts = Object.fromEntries(CONNECTION_TIMEOUTS.map((timeout) => [timeout, connectionTimeouts.labels({ timeout })])) as Record<
    ConnectionTimeout,
    ReturnType<typeof connectionTimeouts.labels>
  >;
  const connectionsRefused = new Counter({
    name: "typesafe_connections_refused_total",
    help: "Client connections closed on accept because the service held TYPESAFE_MAX_CONNECTIONS already.",
    registers: [registry],
  });
  const signIns = new Counter({
    name: "typesafe_account_sign_ins_total",
    help: "Sign-ins to the account area by outcome: ok, failed (wrong email or password), throttled.",
    labelNames: ["outcome"] as const,
    registers: [registry],
  });
  for (const outcome of SIGN_IN_OUTCOMES) signIns.labels({ outcome }).inc(0);
  const { liveSessions } = deps;
  if (liveSessions) {
    new Gauge({
      name: "typesafe_account_sessions_active",
      help: "Account-area sessions live now (not signed out, idle or expired), across replicas.",
      registers: [registry],
      async collect() {
        // An unreachable database must not fail the whole scrape: the gauge keeps its last value.
        const count = await liveSessions().catch(() => undefined);
        if (count !== undefined) this.set(count);
      },
    });
  }

  const llmOutcomes = Object.fromEntries(LLM_CALL_OUTCOMES.map((outcome) => [outcome, llmCalls.labels({ outcome })])) as Record<
    LlmCallOutcome,
    ReturnType<typeof llmCalls.labels>
  >;
  const tokenKinds = {
    input: llmTokens.labels({ kind: "input" }),
    cachedInput: llmTokens.labels({ kind: "cached_input" }),
    output: llmTokens.labels({ kind: "output" }),
  };
  const callSeries = new Map<string, { count: ReturnType<typeof calls.labels>; seconds: ReturnType<typeof callSeconds.labels> }>();

  return {
    registry,
    recordCall(procedure, protocol, reason, seconds) {
      const key = `${procedure}\n${protocol}\n${reason}`;
      let series = callSeries.get(key);
      if (!series) {
        const labels = { procedure: knownProcedure(procedure), protocol: protocolName(protocol) };
        series = { count: calls.labels({ ...labels, reason }), seconds: callSeconds.labels(labels) };
        // Raw procedures and content types come from clients: only so many are remembered.
        if (callSeries.size < MAX_CACHED_CALL_SERIES) callSeries.set(key, series);
      }
      series.count.inc();
      series.seconds.observe(seconds);
    },
    recordLlmCall(outcome, seconds) {
      llmOutcomes[outcome].inc();
      llmSeconds.observe(seconds);
    },
    recordDecision(tokens, methods) {
      tokenKinds.input.inc(tokens.input);
      tokenKinds.cachedInput.inc(tokens.cachedInput);
      tokenKinds.output.inc(tokens.output);
      for (const method of methods) decisionAnswers.labels({ method }).inc();
    },
    recordSearchSource(source, status, seconds, cached) {
      searchSources.inc({ source, status });
      searchSeconds.observe({ source }, seconds);
      if (cached) searchCacheHits.inc({ source });
    },
    recordSearchFilterDrops(source, dropped) {
      for (const [filter, count] of Object.entries(dropped)) if (count) searchFilterDrops.inc({ source, filter }, count);
    },
    observeOpenConnections(count) {
      openConnections = count;
    },
    recordConnectionTimeout(timeout) {
      timeoutCounts[timeout].inc();
    },
    recordConnectionRefused() {
      connectionsRefused.inc();
    },
    recordSignIn(outcome) {
      signIns.labels({ outcome }).inc();
    },
  };
}

/** The part of knex's tarn pool the gauge reads. */
interface TarnPool {
  numUsed(): number;
  numFree(): number;
  numPendingAcquires(): number;
}

/** Our RPC names; a refused path (404) is "other", so clients cannot mint label values. */
function knownProcedure(procedure: string): string {
  return /^\/(typesafe|grpc)\.[\w.]+\/\w+$/.test(procedure) ? procedure : "other";
}

/** gateway, grpc, grpc-web, connect or other, from the call's protocol or content type. */
function protocolName(protocol: string): string {
  if (protocol === "gateway") return "gateway";
  if (protocol.startsWith("application/grpc-web")) return "grpc-web";
  if (protocol.startsWith("application/grpc")) return "grpc";
  if (protocol.startsWith("application/json") || protocol.startsWith("application/proto") || protocol.startsWith("application/connect")) {
    return "connect";
  }
  return "other";
}

/** Times every knex statement by its query id, from knex's own query events. */
function observeQueries(db: Knex, record: (outcome: "ok" | "error", seconds: number) => void): void {
  const started = new Map<string, number>();
  const done = (outcome: "ok" | "error") => (_: unknown, query: { __knexQueryUid?: string }) => {
    const uid = query.__knexQueryUid;
    const start = uid === undefined ? undefined : started.get(uid);
    if (start === undefined) return;
    started.delete(uid!);
    record(outcome, (performance.now() - start) / 1000);
  };
  db.on("query", (query: { __knexQueryUid?: string }) => {
    if (query.__knexQueryUid === undefined) return;
    if (started.size > 10_000) started.clear(); // statements whose answer event never came
    started.set(query.__knexQueryUid, performance.now());
  });
  db.on("query-response", done("ok"));
  db.on("query-error", done("error"));
}
