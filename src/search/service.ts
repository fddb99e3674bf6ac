import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { Knex } from "knex";
import type { Meter } from "../metering/meter.js";
import type { SearchService } from "../gen/typesafe/search/v1/search_service_pb.js";
import { apiError } from "../errors.js";
import { authenticate, requireApiKey } from "../rpc/auth.js";
import { throwIfInvalid } from "../validation.js";
import { validateSearchRequest } from "./validate.js";

/** SearchService for gRPC, Connect and the JSON gateway alike. */
export function createSearchService(deps: { db: Knex; meter: Meter }): ServiceImpl<typeof SearchService> {
  return {
    async search(request, ctx: HandlerContext) {
      const apiKey = requireApiKey(ctx);
      throwIfInvalid(validateSearchRequest(request));
      await authenticate(deps.db, apiKey);
      throw apiError("NOT_CONFIGURED", "search is not configured: no search source is enabled");
    },
    async listSources(_request, ctx: HandlerContext) {
      await authenticate(deps.db, requireApiKey(ctx));
      return { sources: [] };
    },
  };
}
