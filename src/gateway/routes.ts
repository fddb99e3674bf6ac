import type { ServiceImpl } from "@connectrpc/connect";
import { DecisionService } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { SearchService } from "../gen/typesafe/search/v1/search_service_pb.js";
import { findSearchJsonViolation } from "../search/validate.js";
import { rpcRoute, type RpcRoute } from "./gateway.js";

/** The /api/v1 path table: each path is one unary RPC of the Protobuf contract. */
export function apiRoutes(services: {
  decision: ServiceImpl<typeof DecisionService>;
  search: ServiceImpl<typeof SearchService>;
}): RpcRoute[] {
  return [
    rpcRoute({
      httpMethod: "POST",
      path: "/api/v1/decisions",
      method: DecisionService.method.decide,
      impl: services.decision.decide,
      finishData: dropEmptyAnswerFields,
    }),
    rpcRoute({
      httpMethod: "POST",
      path: "/api/v1/search",
      method: SearchService.method.search,
      impl: services.search.search,
      checkBody: findSearchJsonViolation,
      finishData: nullMissingDates,
    }),
    rpcRoute({
      httpMethod: "GET",
      path: "/api/v1/sources",
      method: SearchService.method.listSources,
      impl: services.search.listSources,
    }),
  ];
}

/** Answers keep only the fields of their type (a noul answer has no empty `probabilities`). */
function dropEmptyAnswerFields(data: Record<string, unknown>): void {
  const answers = (data["answers"] ?? {}) as Record<string, Record<string, unknown>>;
  for (const answer of Object.values(answers)) {
    for (const [key, value] of Object.entries(answer)) {
      if (typeof value === "object" && value !== null && Object.keys(value).length === 0) delete answer[key];
    }
  }
}

/** The contract promises `published_at` on every result (an ISO date or null); `discussion_url` likewise is a URL or null. */
function nullMissingDates(data: Record<string, unknown>): void {
  const results = (data["results"] ?? []) as Record<string, unknown>[];
  data["results"] = results.map(({ title, url, snippet, published_at = null, discussion_url = null, ...rest }) => ({ title, url, snippet, published_at, discussion_url, ...rest }));
}
