import type { Knex } from "knex";
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
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
}

const METER_COUNTERS: [keyof MeterStats, string, string][] = [
  ["holdsExpired", "typesafe_meter_holds_expired_total", "Holds released by lease expiry (this replica's sweeper)."],
  ["lateSettles", "typesafe_meter_late_settles_total", "Work finished after its hold expired: answered as an error, not billed."],
  ["settleFailures", "typesafe_meter_settle_failures_total", "Settles that could not be recorded (answered 503; the lease releases the hold)."],
  ["releaseFailures", "typesafe_meter_release_failures_total", "Releases that could not be recorded (the lease releases the hold)."],
  ["cappedCharges", "typesafe_meter_capped_charges_total", "Actual costs above the reservation, charged at the reservation."],
];

export function createMetrics(deps: { meter: Meter; db: Knex }): Metrics {
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

  return {
    registry,
    recordCall(procedure, protocol, reason, seconds) {
      const labels = { procedure: knownProcedure(procedure), protocol: protocolName(protocol) };
      calls.inc({ ...labels, reason });
      callSeconds.observe(labels, seconds);
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
