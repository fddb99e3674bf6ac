import { ScalarType, type DescEnum, type DescField, type DescMessage, type DescMethod, type Registry } from "@bufbuild/protobuf";
import { ACCOUNT_AREA_ANSWERS, ACCOUNT_AREA_REASONS, REASONS, type Reason } from "../errors.js";
import { MAX_NESTING_DEPTH } from "../validation.js";
import { httpBindingOf, jsonTouchesOf } from "../http/http-bindings.js";
import { SESSIONLESS_METHODS } from "../sign-in/sessions.js";
import { DECIMAL_STRING, REQUEST_RULES } from "./request-rules.js";

/** A JSON Schema (2020-12, OpenAPI 3.1's dialect) as plain data. */
export type JsonSchema = Record<string, unknown>;

/** Leading comments of proto elements, when the descriptors carry source info. */
export type CommentsOf = (desc: DescMessage | DescField | DescEnum | DescMethod) => string | undefined;

/**
 * A service the document describes, one section (tag) each, and how its
 * callers prove who they are: the API's key, or the account area's session
 * cookie (which has its own security scheme and its own error answers).
 */
export interface DocumentedService {
  typeName: string;
  door: "apiKey" | "session";
}

/** The session cookie's name over http; over https browsers get it as `__Host-typesafe_session`. */
const SESSION_COOKIE_NAME = "typesafe_session";

/** RPCs that run under metering: they take Idempotency-Key and answer with RateLimit-* fields. */
const METERED_RPCS = new Set(["typesafe.decision.v1.DecisionService.Decide", "typesafe.search.v1.SearchService.Search"]);

/**
 * The OpenAPI 3.1 document of the JSON surface, built from the proto: every
 * RPC with a `google.api.http` annotation is a path; its request message is
 * the body schema as the gateway reads it (proto3 JSON plus the message's
 * validation rules), its response message the `data` schema as the gateway
 * writes it (proto field names, implicit fields always present); every error
 * reason of the table in src/errors.ts is a response of its HTTP status.
 */
export function buildOpenApiDocument(registry: Registry, services: DocumentedService[], version: string, commentsOf: CommentsOf = () => undefined): JsonSchema {
  const boundMethods: DescMethod[] = [];
  const doors = new Map(services.map(({ typeName, door }) => [typeName, door]));
  for (const { typeName } of services) {
    const service = registry.getService(typeName);
    if (!service) throw new Error(`${typeName} is not in the descriptors`);
    boundMethods.push(...service.methods.filter((method) => httpBindingOf(method) !== undefined));
  }
  // A message used on both sides gets a second schema for its request form, since the two differ.
  const outputs = new Set(boundMethods.flatMap((method) => [...messagesReachableFrom(method.output)]));
  const schemas: Record<string, JsonSchema> = {};
  const refTo = (message: DescMessage, role: Role): JsonSchema => {
    const name = role === "output" || !outputs.has(message.typeName) ? message.typeName : `${message.typeName}.Input`;
    if (!(name in schemas)) {
      schemas[name] = {}; // reserved first: messages may refer to themselves
      schemas[name] = role === "output" ? outputSchema(message, refTo, commentsOf) : inputSchema(message, name, refTo, commentsOf, define);
    }
    return { $ref: `#/components/schemas/${name}` };
  };
  const define = (name: string, schema: JsonSchema): JsonSchema => {
    schemas[name] = schema;
    return { $ref: `#/components/schemas/${name}` };
  };

  const paths: Record<string, Record<string, JsonSchema>> = {};
  for (const method of boundMethods) {
    const service = method.parent;
    const binding = httpBindingOf(method)!;
    const metered = METERED_RPCS.has(`${service.typeName}.${method.name}`);
    const touches = jsonTouchesOf(method);
    const session = doors.get(service.typeName) === "session";
    const sessionless = session && SESSIONLESS_METHODS.has(method.name);
    const operation: JsonSchema = {
      operationId: `${service.name}_${method.name}`,
      summary: commentsOf(method),
      tags: [service.name],
      security: session ? (sessionless ? [] : [{ sessionCookie: [] }]) : [{ apiKey: [] }],
      parameters: metered ? [{ $ref: "#/components/parameters/IdempotencyKey" }] : [],
      responses: {
        "200": {
          description: `The ${method.output.name} as \`data\` of the envelope.`,
          headers: {
            ...commonHeaders,
            ...(metered ? rateLimitHeaders(true) : {}),
            ...(metered ? replayedHeader : {}),
            ...(session ? noStoreHeader : {}),
            ...(sessionless ? setCookieHeader : {}),
          },
          content: { "application/json": { schema: successEnvelope(refTo(method.output, "output")) } },
        },
        ...(session ? accountErrorResponseRefs : errorResponseRefs),
      },
    };
    if (binding.httpMethod === "POST") {
      operation["requestBody"] = { required: true, content: { "application/json": { schema: refTo(method.input, "input") } } };
    }
    paths[binding.path] = { ...paths[binding.path], [binding.httpMethod.toLowerCase()]: operation };
    touches?.documentData?.(schemas);
  }
  for (const probe of ["/healthz", "/readyz"]) {
    paths[probe] = { get: probeOperation(probe) };
  }
  schemas["typesafe.error.v1.ErrorDetail"] ??= {};
  const errorDetail = registry.getMessage("typesafe.error.v1.ErrorDetail");
  if (errorDetail) {
    // Errors are rendered without implicit fields: only the reason is always there.
    schemas["typesafe.error.v1.ErrorDetail"] = { ...outputSchema(errorDetail, refTo, commentsOf), required: ["reason"] };
  }

  return {
    openapi: "3.1.0",
    info: {
      title: "typesafe Decision & Search API",
      version,
      description:
        "The JSON surface of the typesafe service, generated from its Protobuf contract (proto/). " +
        "Every answer is an envelope: `code` 0 and `data` on success, else the reason's stable code and an ErrorDetail as `data`. " +
        "The same RPCs are served over gRPC and Connect on the same port. " +
        "Beyond the request schemas, every body is refused when it is larger than the service's limit (413), " +
        `or holds a text or key with a lone UTF-16 surrogate, a \`__proto__\` key, a number too large for a double, or free-form JSON nested deeper than ${MAX_NESTING_DEPTH} levels (400).` +
        (doors.has(ACCOUNT_SERVICE) ? ACCOUNT_AREA_DESCRIPTION : ""),
    },
    paths,
    components: {
      securitySchemes: {
        apiKey: { type: "http", scheme: "bearer", description: "The account's API key: `Authorization: Bearer <key>`." },
        ...(doors.has(ACCOUNT_SERVICE)
          ? {
              sessionCookie: {
                type: "apiKey",
                in: "cookie",
                name: SESSION_COOKIE_NAME,
                description:
                  "The account area's session, set by SignIn or AcceptInvite (HttpOnly, SameSite=Strict; named `__Host-typesafe_session` when the service is reached over https). An API key is never accepted here.",
              },
            }
          : {}),
      },
      responses: { ...errorResponses(apiReasons, "Error"), ...(doors.has(ACCOUNT_SERVICE) ? errorResponses(accountReasons, "AccountError", noStoreHeader) : {}) },
      parameters: {
        IdempotencyKey: {
          name: "Idempotency-Key",
          in: "header",
          required: false,
          description: "A retry with the same key returns the stored answer without charging again (keys live 24 h).",
          schema: { type: "string", minLength: 1, maxLength: 255 },
        },
      },
      schemas,
    },
  };
}

const commonHeaders: Record<string, JsonSchema> = {
  "x-request-id": { required: true, description: "The id of this call, also in the service log.", schema: { type: "string" } },
};

/** The account area's answers are never cached. */
const noStoreHeader: Record<string, JsonSchema> = {
  "cache-control": { required: true, description: "Account answers are never stored by caches.", schema: { const: "no-store" } },
};

const setCookieHeader: Record<string, JsonSchema> = {
  "set-cookie": { description: "The session cookie: a new session on sign-in, an expired cookie on sign-out.", schema: { type: "string" } },
};

const ACCOUNT_SERVICE = "typesafe.account.v1.AccountService";

const ACCOUNT_AREA_DESCRIPTION =
  " The account area (AccountService, under /account/v1) is for an account's members in its own web page: " +
  "it is authenticated by the session cookie SignIn sets, never by an API key (SIGNED_OUT, 401), " +
  "and a call whose Origin or Sec-Fetch-Site names another site is refused (CROSS_SITE_REFUSED, 403). " +
  "No text of its requests, query parameters included, may hold U+0000 or a lone UTF-16 surrogate (400).";

const replayedHeader: Record<string, JsonSchema> = {
  "idempotent-replayed": { description: "`true` when the answer is the stored one of an earlier call with the same Idempotency-Key.", schema: { const: "true" } },
};

function rateLimitHeaders(required: boolean): Record<string, JsonSchema> {
  const integer = { type: "string", pattern: "^[0-9]+$" };
  return {
    "ratelimit-limit": { required, description: "Calls allowed in the rolling minute.", schema: integer },
    "ratelimit-remaining": { required, description: "Calls left in the rolling minute.", schema: integer },
    "ratelimit-reset": { required, description: "Seconds until a call is freed in the rolling minute.", schema: integer },
  };
}

function successEnvelope(data: JsonSchema): JsonSchema {
  return {
    type: "object",
    required: ["code", "message", "data"],
    additionalProperties: false,
    properties: { code: { const: 0 }, message: { const: "ok" }, data },
  };
}

/** The reasons the documented surface can answer: the account area's own stay out of it. */
const apiReasons = (Object.keys(REASONS) as Reason[]).filter((reason) => !ACCOUNT_AREA_REASONS.has(reason));

/** The reasons the account area can answer: its own and the common ones, none of the metering's. */
const accountReasons = (Object.keys(REASONS) as Reason[]).filter((reason) => ACCOUNT_AREA_ANSWERS.has(reason));

/** References to one response per HTTP status of some reasons, lowest status first. */
function errorResponseRefsOf(reasons: Reason[], prefix: string): Record<string, JsonSchema> {
  const statuses = [...new Set(reasons.map((reason) => REASONS[reason].http))].sort((a, b) => a - b);
  return Object.fromEntries(statuses.map((status) => [String(status), { $ref: `#/components/responses/${prefix}${status}` }]));
}

const errorResponseRefs = errorResponseRefsOf(apiReasons, "Error");
const accountErrorResponseRefs = errorResponseRefsOf(accountReasons, "AccountError");

/** One response per HTTP status of the reasons, listing them. */
function errorResponses(answered: Reason[], prefix: string, extraHeaders: Record<string, JsonSchema> = {}): Record<string, JsonSchema> {
  const byStatus = new Map<number, Reason[]>();
  for (const reason of answered) {
    const status = REASONS[reason].http;
    byStatus.set(status, [...(byStatus.get(status) ?? []), reason]);
  }
  const responses: Record<string, JsonSchema> = {};
  for (const [status, reasons] of byStatus) {
    const retryable = status === 429 || status === 503;
    responses[`${prefix}${status}`] = {
      description: reasons.map((reason) => `${reason}: ${REASONS[reason].meaning}`).join(" "),
      headers: {
        ...commonHeaders,
        ...extraHeaders,
        ...(retryable ? { "retry-after": { description: "Seconds to wait before a retry, when known.", schema: { type: "string", pattern: "^[0-9]+$" } } } : {}),
        ...(status === 429 && prefix === "Error" ? rateLimitHeaders(false) : {}),
      },
      content: {
        "application/json": {
          schema: {
            type: "object",
            required: ["code", "message", "data"],
            additionalProperties: false,
            properties: {
              code: { type: "integer", enum: reasons.map((reason) => REASONS[reason].envelope) },
              message: { type: "string" },
              data: { allOf: [{ $ref: "#/components/schemas/typesafe.error.v1.ErrorDetail" }, { type: "object", properties: { reason: { type: "string", enum: reasons } } }] },
            },
          },
        },
      },
    };
  }
  return responses;
}

function probeOperation(path: string): JsonSchema {
  const status = path === "/healthz" ? "up" : "ready";
  return {
    operationId: path === "/healthz" ? "Health_Live" : "Health_Ready",
    summary: path === "/healthz" ? "Liveness: the process answers." : "Readiness: the database answers.",
    tags: ["Health"],
    responses: {
      "200": {
        description: `The service is ${status}.`,
        headers: commonHeaders,
        content: {
          "application/json": {
            schema: successEnvelope({
              type: "object",
              required: ["status"],
              additionalProperties: false,
              properties: {
                status: { const: status },
                decisions: {
                  type: "object",
                  description: "What decisions run on; with the embedded model, its state (a download shows its percent, a failed one when it is tried again). Readiness does not wait for the model.",
                  required: ["engine"],
                  additionalProperties: false,
                  properties: {
                    engine: { enum: ["upstream", "embedded", "off"] },
                    model_state: { enum: ["fetching", "loading", "ready", "failed"] },
                    percent: { type: "number", minimum: 0, maximum: 100 },
                    next_try_in_seconds: { type: "integer", minimum: 1, description: "After a failed download: seconds until it is tried again." },
                  },
                },
              },
            }),
          },
        },
      },
      ...(path === "/readyz" ? { "503": errorResponseRefs["503"] } : {}),
    },
  };
}

type Role = "input" | "output";
type RefTo = (message: DescMessage, role: Role) => JsonSchema;

/** Every message type a message's fields lead to, itself included. */
function messagesReachableFrom(message: DescMessage, seen = new Set<string>()): Set<string> {
  if (seen.has(message.typeName)) return seen;
  seen.add(message.typeName);
  for (const field of message.fields) {
    if (field.message) messagesReachableFrom(field.message, seen);
  }
  return seen;
}

/** An answer message in the gateway's JSON form: proto field names; implicit scalars, lists and maps always present. */
function outputSchema(message: DescMessage, refTo: RefTo, commentsOf: CommentsOf): JsonSchema {
  const properties: Record<string, JsonSchema> = {};
  const required: string[] = [];
  for (const field of message.fields) {
    const description = commentsOf(field);
    properties[field.name] = { ...fieldSchema(field, "output", refTo), ...(description ? { description } : {}) };
    const alwaysEmitted = field.fieldKind === "list" || field.fieldKind === "map" || (field.fieldKind !== "message" && field.presence === IMPLICIT && field.oneof === undefined);
    if (alwaysEmitted) required.push(field.name);
  }
  const description = commentsOf(message);
  return { type: "object", ...(description ? { description } : {}), required, additionalProperties: false, properties };
}

/**
 * A request message as the gateway reads it: proto3 JSON makes every field
 * optional and reads null as absent; the message's validation rules
 * (request-rules.ts) make some required and bound others.
 */
function inputSchema(message: DescMessage, name: string, refTo: RefTo, commentsOf: CommentsOf, define: (name: string, schema: JsonSchema) => JsonSchema): JsonSchema {
  const rules = REQUEST_RULES[message.typeName] ?? {};
  const required = rules.required ?? [];
  const properties: Record<string, JsonSchema> = {};
  for (const field of message.fields) {
    const description = commentsOf(field);
    const schema = { ...fieldSchema(field, "input", refTo), ...rules.fields?.[field.name], ...(description ? { description } : {}) };
    properties[field.name] = required.includes(field.name) ? schema : orNull(schema);
  }
  const description = [commentsOf(message), rules.alsoRefused && `Also refused: ${rules.alsoRefused}`].filter(Boolean).join(" ");
  const schema: JsonSchema = { type: "object", ...(description ? { description } : {}), ...(required.length > 0 ? { required } : {}), additionalProperties: false, properties };
  if (!rules.variants) return schema;
  // One named schema per value of the field, so generators can tell the shapes apart by it.
  const refs = Object.entries(rules.variants.of(schema)).map(([value, variant]) => [value, define(`${name}.${value}`, variant)] as const);
  return {
    ...(description ? { description } : {}),
    oneOf: refs.map(([, ref]) => ref),
    discriminator: { propertyName: rules.variants.by, mapping: Object.fromEntries(refs.map(([value, ref]) => [value, ref["$ref"]])) },
  };
}

/** The schema that also accepts null, which proto3 JSON reads as "not given". */
function orNull(schema: JsonSchema): JsonSchema {
  if (Object.keys(schema).every((key) => key === "description")) return schema; // already any JSON value
  const { description, ...rest } = schema;
  const withDescription = (s: JsonSchema): JsonSchema => (description ? { ...s, description } : s);
  if (typeof rest["type"] === "string" && Object.keys(rest).every((key) => key !== "anyOf" && key !== "oneOf" && key !== "$ref")) {
    const nullable: JsonSchema = { ...rest, type: [rest["type"], "null"] };
    if (Array.isArray(rest["enum"])) nullable["enum"] = [...(rest["enum"] as unknown[]), null];
    return withDescription(nullable);
  }
  return withDescription({ anyOf: [rest, { type: "null" }] });
}

/** FeatureSet.FieldPresence.IMPLICIT: proto3 fields without `optional`. */
const IMPLICIT = 2;

function fieldSchema(field: DescField, role: Role, refTo: RefTo): JsonSchema {
  const scalar = role === "output" ? scalarSchema : inputScalarSchema;
  const message = (desc: DescMessage): JsonSchema => wellKnownSchema(desc) ?? refTo(desc, role);
  const enumOf = (desc: DescEnum): JsonSchema => (role === "output" ? enumSchema(desc) : inputEnumSchema(desc));
  switch (field.fieldKind) {
    case "scalar":
      return scalar(field.scalar);
    case "enum":
      return enumOf(field.enum);
    case "message":
      return message(field.message);
    case "list":
      return { type: "array", items: field.listKind === "scalar" ? scalar(field.scalar) : field.listKind === "enum" ? enumOf(field.enum) : message(field.message) };
    case "map":
      return { type: "object", additionalProperties: field.mapKind === "scalar" ? scalar(field.scalar) : field.mapKind === "enum" ? enumOf(field.enum) : message(field.message) };
  }
}

/** A scalar as the gateway writes it. */
function scalarSchema(scalar: ScalarType): JsonSchema {
  switch (scalar) {
    case ScalarType.STRING:
      return { type: "string" };
    case ScalarType.BOOL:
      return { type: "boolean" };
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return { type: "number" };
    case ScalarType.BYTES:
      return { type: "string", contentEncoding: "base64" };
    case ScalarType.INT64:
    case ScalarType.UINT64:
    case ScalarType.SINT64:
    case ScalarType.FIXED64:
    case ScalarType.SFIXED64:
      return { type: "string", pattern: "^-?[0-9]+$" }; // 64-bit integers are strings in proto JSON
    default:
      return { type: "integer", format: "int32" };
  }
}

/** A scalar as proto3 JSON reads it: numbers may also come as decimal strings. */
function inputScalarSchema(scalar: ScalarType): JsonSchema {
  switch (scalar) {
    case ScalarType.STRING:
    case ScalarType.BOOL:
    case ScalarType.BYTES:
      return scalarSchema(scalar);
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      // The strings a decoder reads as a number: a JavaScript numeric literal, or the three named values.
      return { type: ["number", "string"], pattern: DECIMAL_STRING };
    default:
      return { type: ["integer", "string"], pattern: "^-?[0-9]+$" };
  }
}

function enumSchema(desc: DescEnum): JsonSchema {
  if (desc.typeName === "google.protobuf.NullValue") return { type: "null" };
  return { type: "string", enum: desc.values.map((value) => value.name) };
}

/** proto3 JSON reads an enum from its value's name or its number. */
function inputEnumSchema(desc: DescEnum): JsonSchema {
  if (desc.typeName === "google.protobuf.NullValue") return { type: "null" };
  return { anyOf: [enumSchema(desc), { type: "integer" }] };
}

/** Well-known types have their own JSON form. */
function wellKnownSchema(message: DescMessage): JsonSchema | undefined {
  switch (message.typeName) {
    case "google.protobuf.Value":
      return {};
    case "google.protobuf.Struct":
      return { type: "object", additionalProperties: true };
    case "google.protobuf.ListValue":
      return { type: "array" };
    case "google.protobuf.Timestamp":
      return { type: "string", format: "date-time" };
    case "google.protobuf.Duration":
      return { type: "string", pattern: "^-?[0-9]+(\\.[0-9]+)?s$" };
    default:
      return undefined;
  }
}
