import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { Knex } from "knex";
import type { Meter } from "../metering/meter.js";
import type { DecisionService } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { apiError } from "../errors.js";
import { authenticate, requireApiKey } from "../rpc/auth.js";
import { throwIfInvalid } from "../validation.js";
import { validateDecideRequest } from "./validate.js";

/** DecisionService for gRPC, Connect and the JSON gateway alike. */
export function createDecisionService(deps: { db: Knex; meter: Meter }): ServiceImpl<typeof DecisionService> {
  return {
    async decide(request, ctx: HandlerContext) {
      const apiKey = requireApiKey(ctx);
      throwIfInvalid(validateDecideRequest(request));
      await authenticate(deps.db, apiKey);
      throw apiError("NOT_CONFIGURED", "decisions are not configured: no upstream LLM (TYPESAFE_LLM_BASE_URL)");
    },
  };
}
