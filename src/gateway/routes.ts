import { getOption, hasOption, type DescMethod, type DescMethodUnary, type DescService } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import { http } from "../gen/google/api/annotations_pb.js";
import { DecisionService } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { SearchService } from "../gen/typesafe/search/v1/search_service_pb.js";
import { requireApiKey } from "../call/authentication.js";
import type { RouteDoor, RpcRoute } from "./gateway.js";

/** A service and its implementation, as registered on the Connect router, and the door of its JSON paths. */
export interface ServedService<S extends DescService = DescService> {
  service: S;
  impl: ServiceImpl<S>;
  /** Who may call its JSON paths; the API key when not given. */
  door?: RouteDoor;
}

/** A service for the path table; without a door of its own, its paths need an API key. */
export function served<S extends DescService>(service: S, impl: ServiceImpl<S>, door?: RouteDoor): ServedService {
  return { service, impl, door } as unknown as ServedService;
}

/** The API's door: a well-formed `Authorization: Bearer` key (the service checks that it is live). */
export const apiKeyDoor: RouteDoor = (ctx) => {
  requireApiKey(ctx);
};

/** Where a JSON path goes, read from a method's `google.api.http` annotation. */
export interface HttpBinding {
  httpMethod: "GET" | "POST";
  path: string;
}

/**
 * The JSON path table, built from the `google.api.http` annotations in
 * proto/: every annotated unary RPC of a served service gets its path, so the
 * proto is the source of truth for the HTTP surface as for the messages.
 */
export function apiRoutes(services: ServedService[]): RpcRoute[] {
  const routes: RpcRoute[] = [];
  for (const { service, impl, door = apiKeyDoor } of services) {
    for (const method of service.methods) {
      const binding = httpBindingOf(method);
      if (binding === undefined) continue;
      const handler = (impl as Record<string, RpcRoute["impl"] | undefined>)[method.localName];
      if (method.methodKind !== "unary") throw new Error(`${method.parent.typeName}.${method.name}: an HTTP binding needs a unary RPC`);
      if (handler === undefined) throw new Error(`${method.parent.typeName}.${method.name}: has an HTTP binding but no implementation`);
      const touches = jsonTouchesOf(method);
      routes.push({ ...binding, method: method as DescMethodUnary, impl: handler.bind(impl), door, reshapeAnswerJson: touches?.reshapeAnswerJson });
    }
  }
  return routes;
}

/**
 * The HTTP binding of a method, or undefined when it has none. The gateway
 * serves what the contract needs: `get` without a body, `post` with `body: "*"`,
 * literal paths; any other rule is refused at start rather than half-served.
 */
export function httpBindingOf(method: DescMethod): HttpBinding | undefined {
  if (!hasOption(method, http)) return undefined;
  const rule = getOption(method, http);
  const where = `${method.parent.typeName}.${method.name}`;
  if (rule.additionalBindings.length > 0) throw new Error(`${where}: additional_bindings are not supported`);
  const { pattern } = rule;
  let binding: HttpBinding;
  if (pattern.case === "get" && rule.body === "") binding = { httpMethod: "GET", path: pattern.value };
  else if (pattern.case === "post" && rule.body === "*") binding = { httpMethod: "POST", path: pattern.value };
  else throw new Error(`${where}: only get without a body and post with body "*" are supported`);
  if (!/^(\/[A-Za-z0-9._~-]+)+$/.test(binding.path)) throw new Error(`${where}: ${binding.path} must be a literal path`);
  return binding;
}

/**
 * What the JSON surface of an RPC adds to its answers: touches on the
 * answer's `data`, and the same touches described in the OpenAPI document's
 * schemas (by message type name). Rules of the request's JSON are the request
 * contract's, the same on every door.
 */
export interface JsonTouches extends Pick<RpcRoute, "reshapeAnswerJson"> {
  documentData?: (schemas: Record<string, Record<string, unknown>>) => void;
}

/** The touches of an RPC, by its full name (so descriptors from any registry find them). */
export function jsonTouchesOf(method: DescMethod): JsonTouches | undefined {
  return jsonTouches[`${method.parent.typeName}.${method.name}`];
}

const jsonTouches: Record<string, JsonTouches> = {
  [`${DecisionService.typeName}.${DecisionService.method.decide.name}`]: {
    reshapeAnswerJson: dropEmptyAnswerFields,
    documentData: (schemas) => {
      notRequired(schemas["typesafe.decision.v1.Answer"], ["probabilities", "legend"]);
      notRequired(schemas["typesafe.decision.v1.CalibratedAnswer"], ["probabilities"]);
    },
  },
  [`${SearchService.typeName}.${SearchService.method.search.name}`]: {
    reshapeAnswerJson: nullMissingDates,
    documentData: (schemas) => requiredOrNull(schemas["typesafe.search.v1.Result"], ["published_at", "discussion_url"]),
  },
};

function notRequired(schema: Record<string, unknown> | undefined, fields: string[]): void {
  if (!schema) return;
  schema["required"] = (schema["required"] as string[]).filter((name) => !fields.includes(name));
}

function requiredOrNull(schema: Record<string, unknown> | undefined, fields: string[]): void {
  if (!schema) return;
  const properties = schema["properties"] as Record<string, Record<string, unknown>>;
  for (const name of fields) properties[name] = { ...properties[name], type: [properties[name]!["type"], "null"] };
  schema["required"] = [...(schema["required"] as string[]), ...fields];
}

/** Answers keep only the fields of their type (a noul answer has no empty `probabilities`), and so does a calibrated answer inside one. */
function dropEmptyAnswerFields(data: Record<string, unknown>): void {
  const answers = (data["answers"] ?? {}) as Record<string, Record<string, unknown>>;
  const dropEmpty = (answer: Record<string, unknown>) => {
    for (const [key, value] of Object.entries(answer)) {
      if (typeof value === "object" && value !== null && Object.keys(value).length === 0) delete answer[key];
    }
  };
  for (const answer of Object.values(answers)) {
    dropEmpty(answer);
    if (typeof answer["x_calibrated"] === "object" && answer["x_calibrated"] !== null) dropEmpty(answer["x_calibrated"] as Record<string, unknown>);
  }
}

/** The contract promises `published_at` on every result (an ISO date or null); `discussion_url` likewise is a URL or null. */
function nullMissingDates(data: Record<string, unknown>): void {
  const results = (data["results"] ?? []) as Record<string, unknown>[];
  data["results"] = results.map(({ title, url, snippet, published_at = null, discussion_url = null, ...rest }) => ({ title, url, snippet, published_at, discussion_url, ...rest }));
}
