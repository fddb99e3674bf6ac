import { setTimeout as delay } from "node:timers/promises";
import type { ConnectRouter } from "@connectrpc/connect";
import { apiError } from "../errors.js";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../gen/grpc/health/v1/health_pb.js";
import { DecisionService } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { SearchService } from "../gen/typesafe/search/v1/search_service_pb.js";

/** "" is the whole server, as the gRPC health protocol defines; the rest are our public services. */
const KNOWN_SERVICES: ReadonlySet<string> = new Set(["", DecisionService.typeName, SearchService.typeName]);

/** How often Watch re-runs the check; load balancers poll Check far more often than this anyway. */
const DEFAULT_WATCH_INTERVAL_MS = 5_000;

/**
 * Registers grpc.health.v1.Health so Kubernetes probes, load balancers and grpc-health-probe can
 * ask whether the server can do work. Every known service shares one `check` (they share the
 * database); a check that rejects counts as NOT_SERVING, because a broken dependency is exactly
 * what health must report rather than fail on. `watchIntervalMs` exists so tests need not wait.
 */
export function registerHealth(
  router: ConnectRouter,
  check: () => Promise<boolean>,
  options: { watchIntervalMs?: number } = {},
): void {
  const intervalMs = options.watchIntervalMs ?? DEFAULT_WATCH_INTERVAL_MS;
  const status = async (): Promise<ServingStatus> => {
    try {
      return (await check()) ? ServingStatus.SERVING : ServingStatus.NOT_SERVING;
    } catch {
      return ServingStatus.NOT_SERVING;
    }
  };

  router.service(Health, {
    async check(req) {
      if (!KNOWN_SERVICES.has(req.service)) {
        throw apiError("NOT_FOUND", `unknown service: ${req.service}`, { field: "service", rule: "a service this server runs, or \"\" for the server" });
      }
      return { status: await status() };
    },
    async *watch(req, ctx) {
      if (!KNOWN_SERVICES.has(req.service)) {
        // The protocol says: report SERVICE_UNKNOWN and keep the call open; our set never changes.
        yield { status: ServingStatus.SERVICE_UNKNOWN };
        await untilAborted(ctx.signal);
        return;
      }
      let last: ServingStatus | undefined;
      while (!ctx.signal.aborted) {
        const current = await status();
        if (current !== last) {
          last = current;
          yield { status: current };
        }
        try {
          await delay(intervalMs, undefined, { signal: ctx.signal });
        } catch {
          return;
        }
      }
    },
  });
}

function untilAborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
}
