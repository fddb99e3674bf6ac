import type { Metrics } from "../metrics.js";
import { create, toJsonString } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { Knex } from "knex";
import type { SearchConfig } from "../config.js";
import { describeError } from "../errors.js";
import {
  CostSchema,
  SearchRequestSchema,
  SearchResponseSchema,
  type SearchService,
} from "../gen/typesafe/search/v1/search_service_pb.js";
import type { Logger } from "../logger.js";
import type { Meter } from "../metering/meter.js";
import { meteredRpc } from "../metering/metered-rpc.js";
import { authenticate, requireApiKey } from "../call/authentication.js";
import { throwIfInvalid } from "../validation.js";
import { createSearchEngine, type SearchPlan } from "./engine.js";
import { validateSearchRequest } from "./validate.js";

export interface SearchServiceDeps {
  db: Knex;
  meter: Meter;
  config: SearchConfig;
  logger: Logger;
  /** Request time T for windows, cache TTLs and rate budgets; tests inject a clock. */
  now?: () => number;
  metrics?: Pick<Metrics, "recordSearchSource" | "recordSearchFilterDrops">;
}

/**
 * SearchService for gRPC, Connect and the JSON gateway alike. The engine
 * (catalog, adapters, rate gates, cache) is built here, once per process:
 * upstream limits are shared by every caller, so their state must be too.
 *
 * Order of checks: the key's shape, the request rules and the source
 * resolution (all 400s) come before any money; an unconfigured deployment
 * authenticates and answers 503; everything else runs under metering, which
 * reserves the price of every source the request could query and settles to
 * the sources whose upstream call answered.
 */
export function createSearchService(deps: SearchServiceDeps): ServiceImpl<typeof SearchService> {
  const engine = createSearchEngine({ config: deps.config, logger: deps.logger, now: deps.now, metrics: deps.metrics });

  return {
    async search(request, ctx: HandlerContext) {
      const apiKey = requireApiKey(ctx);
      throwIfInvalid(validateSearchRequest(request, deps.config.minSafe));
      let plan: SearchPlan;
      try {
        plan = engine.resolve(request);
      } catch (err) {
        if (describeError(err).reason === "NOT_CONFIGURED") await authenticate(deps.db, apiKey);
        throw err;
      }
      const { response, billing } = await meteredRpc(
        deps.meter,
        ctx,
        {
          schema: SearchResponseSchema,
          endpoint: "search",
          apiKey,
          reserveUnits: plan.reserveUnits,
          timeoutMs: deps.config.requestTimeoutMs,
          fingerprint: () => toJsonString(SearchRequestSchema, request),
        },
        async (signal) => {
          const outcome = await engine.search(plan, request.q, signal);
          return {
            response: create(SearchResponseSchema, {
              q: outcome.query,
              s: plan.sources,
              w: plan.window,
              results: outcome.results,
              sources: outcome.sources,
              usage: outcome.usage,
            }),
            chargeUnits: outcome.chargeUnits,
          };
        },
      );
      response.cost = create(CostSchema, billing);
      return response;
    },

    async listSources(_request, ctx: HandlerContext) {
      await authenticate(deps.db, requireApiKey(ctx));
      return { sources: engine.list() };
    },
  };
}
