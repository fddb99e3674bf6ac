import { getOption, hasOption, type DescMethod } from "@bufbuild/protobuf";
import { http } from "../gen/google/api/annotations_pb.js";
import { DecisionService } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { SearchService } from "../gen/typesafe/search/v1/search_service_pb.js";

/*
 * What proto/ says of the JSON surface, read by the gateway (its path table)
 * and by the OpenAPI document alike: each method's `google.api.http` path and
 * the touches the JSON answers get.
 */

/** Where a JSON path goes, read from a method's `google.api.http` annotation. */
export interface HttpBinding {
  httpMethod: "GET" | "POST";
  path: string;
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
export interface JsonTouches {
  /** Final touches on the JSON of `data` (e.g. nulls the contract promises). */
  reshapeAnswerJson?: (data: Record<string, unknown>) => void;
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
