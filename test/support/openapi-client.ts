import createClient, { type Client } from "openapi-fetch";
import type { components, paths } from "../../src/gen/openapi-types.js";

/**
 * A client of the JSON gateway as a user would write one: openapi-fetch with
 * the types openapi-typescript generated from the served OpenAPI document, and
 * nothing of this repository besides. It imports only those two, so the
 * client test can type-check this file on its own.
 */
export type GatewayClient = Client<paths>;

/** The answer of one decision, as the generated types call it. */
export type DecideResponse = components["schemas"]["typesafe.decision.v1.DecideResponse"];

/** A client of the gateway at baseUrl, sending the key on every call. */
export function createGatewayClient(baseUrl: string, apiKey: string): GatewayClient {
  return createClient<paths>({ baseUrl, headers: { authorization: `Bearer ${apiKey}` } });
}

/** A decision request as the generated types define it. */
export type DecideRequest = components["schemas"]["typesafe.decision.v1.DecideRequest"];

/** One decision with a question of each type; throws the envelope of a refusal. */
export async function decideOnce(client: GatewayClient): Promise<DecideResponse> {
  const request: DecideRequest = {
    model: "typesafe/service-1.13",
    state: { ticket: "I was charged twice for my pro plan" },
    questions: {
      urgent: { type: "noul", instructions: "Is it urgent?" },
      team: { type: "choice", instructions: "Which team?", criteria: { billing: null, technical: null } },
      impact: { type: "score", instructions: "How big is the impact?", criteria: ["none", "low", "high"] },
    },
  };
  // openapi-fetch 0.17.0 takes a property typed `null` for a read-only one and leaves it out
  // of request body types, which would refuse the choice's options; the request is checked
  // against the generated type above instead.
  // https://github.com/openapi-ts/openapi-typescript/issues/2717
  const { data, error } = await client.POST("/api/v1/decisions", {
    body: request as never,
    params: { header: { "Idempotency-Key": "openapi-client-decision" } },
  });
  if (error) throw new Error(`decision refused: ${error.code} ${error.data.reason}`);
  return data.data;
}

/** A search that sends its query and nothing else: the default sources and window. */
export async function searchQueryOnly(client: GatewayClient, q: string): Promise<{ resultCount: number; sources: string[]; window: string }> {
  const { data, error } = await client.POST("/api/v1/search", { body: { q } });
  if (error) throw new Error(`search refused: ${error.code} ${error.data.reason}`);
  return { resultCount: data.data.results.length, sources: data.data.s, window: data.data.w };
}

/** What a refused search says, read from the typed envelope of its error answer. */
export async function refusedSearch(client: GatewayClient, q: string): Promise<{ status: number; code: number | undefined; reason: string | undefined; field: string | undefined; rule: string | undefined }> {
  const { error, response } = await client.POST("/api/v1/search", { body: { q } });
  return { status: response.status, code: error?.code, reason: error?.data.reason, field: error?.data.field, rule: error?.data.rule };
}

/**
 * Never called: requests the generated types must refuse at compile time. If
 * the document loosened one of these rules, its `@ts-expect-error` would be
 * unused and the type check fail.
 */
export function requestsTheTypesRefuse(client: GatewayClient): void {
  // @ts-expect-error q is required
  void client.POST("/api/v1/search", { body: {} });
  // @ts-expect-error s lists known source ids only
  void client.POST("/api/v1/search", { body: { q: "x", s: ["bing"] } });
  // @ts-expect-error state is required
  void client.POST("/api/v1/decisions", { body: { model: "typesafe/service-1.13", questions: { a: { type: "noul", instructions: "?" } } } });
  // @ts-expect-error the model is one value
  void client.POST("/api/v1/decisions", { body: { model: "gpt-4o", state: "x", questions: { a: { type: "noul", instructions: "?" } } } });
  // @ts-expect-error a state is a text or an object
  void client.POST("/api/v1/decisions", { body: { model: "typesafe/service-1.13", state: 7, questions: { a: { type: "noul", instructions: "?" } } } });
  // @ts-expect-error a choice needs its options
  void client.POST("/api/v1/decisions", { body: { model: "typesafe/service-1.13", state: "x", questions: { a: { type: "choice", instructions: "?" } } } });
  // @ts-expect-error score labels are a list of texts
  void client.POST("/api/v1/decisions", { body: { model: "typesafe/service-1.13", state: "x", questions: { a: { type: "score", instructions: "?", criteria: { low: null } } } } });
}
