import { ScalarType, type DescEnum, type DescField, type DescMessage, type DescMethod, type Registry } from "@bufbuild/protobuf";
import { ACCOUNT_AREA_REASONS, REASONS, type Reason } from "../errors.js";
import { httpBindingOf, jsonTouchesOf } from "../gateway/routes.js";

/** A JSON Schema (2020-12, OpenAPI 3.1's dialect) as plain data. */
export type JsonSchema = Record<string, unknown>;

/** Leading comments of proto elements, when the descriptors carry source info. */
export type CommentsOf = (desc: DescMessage | DescField | DescEnum | DescMethod) => string | undefined;

/** RPCs that run under metering: they take Idempotency-Key and answer with RateLimit-* fields. */
const METERED_RPCS = new Set(["typesafe.decision.v1.DecisionService.Decide", "typesafe.search.v1.SearchService.Search"]);

/**
 * The OpenAPI 3.1 document of the JSON surface, built from the proto: every
 * RPC with a `google.api.http` annotation is a path, its messages are the
 * request and `data` schemas (in the gateway's JSON form: proto field names,
 * implicit fields always present), and every error reason of the table in
 * src/errors.ts is a response of its HTTP status.
 */
export function buildOpenApiDocument(registry: Registry, services: string[], version: string, commentsOf: CommentsOf = () => undefined): JsonSchema {
  const schemas: Record<string, JsonSchema> = {};
  const refTo = (message: DescMessage): JsonSchema => {
    if (!(message.typeName in schemas)) {
      schemas[message.typeName] = {}; // reserved first: messages may refer to themselves
      schemas[message.typeName] = messageSchema(message, refTo, commentsOf);
    }
    return { $ref: `#/components/schemas/${message.typeName}` };
  };

  const paths: Record<string, Record<string, JsonSchema>> = {};
  for (const typeName of services) {
    const service = registry.getService(typeName);
    if (!service) throw new Error(`${typeName} is not in the descriptors`);
    for (const method of service.methods) {
      const binding = httpBindingOf(method);
      if (!binding) continue;
      const metered = METERED_RPCS.has(`${service.typeName}.${method.name}`);
      const touches = jsonTouchesOf(method);
      const operation: JsonSchema = {
        operationId: `${service.name}_${method.name}`,
        summary: commentsOf(method),
        tags: [service.name],
        security: [{ apiKey: [] }],
        parameters: metered ? [{ $ref: "#/components/parameters/IdempotencyKey" }] : [],
        responses: {
          "200": {
            description: `The ${method.output.name} as \`data\` of the envelope.`,
            headers: { ...commonHeaders, ...(metered ? rateLimitHeaders(true) : {}), ...(metered ? replayedHeader : {}) },
            content: { "application/json": { schema: successEnvelope(refTo(method.output)) } },
          },
          ...errorResponseRefs,
        },
      };
      if (binding.httpMethod === "POST") {
        operation["requestBody"] = { required: true, content: { "application/json": { schema: refTo(method.input) } } };
      }
      paths[binding.path] = { ...paths[binding.path], [binding.httpMethod.toLowerCase()]: operation };
      touches?.documentData?.(schemas);
    }
  }
  for (const probe of ["/healthz", "/readyz"]) {
    paths[probe] = { get: probeOperation(probe) };
  }
  schemas["typesafe.error.v1.ErrorDetail"] ??= {};
  const errorDetail = registry.getMessage("typesafe.error.v1.ErrorDetail");
  if (errorDetail) {
    // Errors are rendered without implicit fields: only the reason is always there.
    schemas["typesafe.error.v1.ErrorDetail"] = { ...messageSchema(errorDetail, refTo, commentsOf), required: ["reason"] };
  }

  return {
    openapi: "3.1.0",
    info: {
      title: "typesafe Decision & Search API",
      version,
      description:
        "The JSON surface of the typesafe service, generated from its Protobuf contract (proto/). " +
        "Every answer is an envelope: `code` 0 and `data` on success, else the reason's stable code and an ErrorDetail as `data`. " +
        "The same RPCs are served over gRPC and Connect on the same port.",
    },
    paths,
    components: {
      securitySchemes: { apiKey: { type: "http", scheme: "bearer", description: "The account's API key: `Authorization: Bearer <key>`." } },
      responses: errorResponses(),
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

/** HTTP statuses of the error table, lowest first. */
/** The reasons the /api/v1 paths can answer: the account area's own stay out of this document. */
const apiReasons = (Object.entries(REASONS) as [Reason, (typeof REASONS)[Reason]][]).filter(([reason]) => !ACCOUNT_AREA_REASONS.has(reason));
const errorStatuses = [...new Set(apiReasons.map(([, entry]) => entry.http))].sort((a, b) => a - b);

const errorResponseRefs: Record<string, JsonSchema> = Object.fromEntries(
  errorStatuses.map((status) => [String(status), { $ref: `#/components/responses/Error${status}` }]),
);

/** One response per HTTP status of the error table, listing its reasons. */
function errorResponses(): Record<string, JsonSchema> {
  const byStatus = new Map<number, Reason[]>();
  for (const [reason, entry] of apiReasons) {
    byStatus.set(entry.http, [...(byStatus.get(entry.http) ?? []), reason]);
  }
  const responses: Record<string, JsonSchema> = {};
  for (const [status, reasons] of byStatus) {
    const retryable = status === 429 || status === 503;
    responses[`Error${status}`] = {
      description: reasons.map((reason) => `${reason}: ${REASONS[reason].meaning}`).join(" "),
      headers: {
        ...commonHeaders,
        ...(retryable ? { "retry-after": { description: "Seconds to wait before a retry, when known.", schema: { type: "string", pattern: "^[0-9]+$" } } } : {}),
        ...(status === 429 ? rateLimitHeaders(false) : {}),
      },
      content: {
        "application/json": {
          schema: {
            type: "object",
            required: ["code", "message", "data"],
            additionalProperties: false,
            properties: {
              code: { enum: reasons.map((reason) => REASONS[reason].envelope) },
              message: { type: "string" },
              data: { $ref: "#/components/schemas/typesafe.error.v1.ErrorDetail", properties: { reason: { enum: reasons } } },
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
        content: { "application/json": { schema: successEnvelope({ type: "object", required: ["status"], additionalProperties: false, properties: { status: { const: status } } }) } },
      },
      ...(path === "/readyz" ? { "503": errorResponseRefs["503"] } : {}),
    },
  };
}

/** A message in the gateway's JSON form: proto field names; implicit scalars, lists and maps always present. */
function messageSchema(message: DescMessage, refTo: (m: DescMessage) => JsonSchema, commentsOf: CommentsOf): JsonSchema {
  const properties: Record<string, JsonSchema> = {};
  const required: string[] = [];
  for (const field of message.fields) {
    const description = commentsOf(field);
    properties[field.name] = { ...fieldSchema(field, refTo), ...(description ? { description } : {}) };
    const alwaysEmitted = field.fieldKind === "list" || field.fieldKind === "map" || (field.fieldKind !== "message" && field.presence === IMPLICIT && field.oneof === undefined);
    if (alwaysEmitted) required.push(field.name);
  }
  const description = commentsOf(message);
  return { type: "object", ...(description ? { description } : {}), required, additionalProperties: false, properties };
}

/** FeatureSet.FieldPresence.IMPLICIT: proto3 fields without `optional`. */
const IMPLICIT = 2;

function fieldSchema(field: DescField, refTo: (m: DescMessage) => JsonSchema): JsonSchema {
  switch (field.fieldKind) {
    case "scalar":
      return scalarSchema(field.scalar);
    case "enum":
      return enumSchema(field.enum);
    case "message":
      return wellKnownSchema(field.message) ?? refTo(field.message);
    case "list":
      return { type: "array", items: field.listKind === "scalar" ? scalarSchema(field.scalar) : field.listKind === "enum" ? enumSchema(field.enum) : (wellKnownSchema(field.message) ?? refTo(field.message)) };
    case "map":
      return { type: "object", additionalProperties: field.mapKind === "scalar" ? scalarSchema(field.scalar) : field.mapKind === "enum" ? enumSchema(field.enum) : (wellKnownSchema(field.message) ?? refTo(field.message)) };
  }
}

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

function enumSchema(desc: DescEnum): JsonSchema {
  if (desc.typeName === "google.protobuf.NullValue") return { type: "null" };
  return { type: "string", enum: desc.values.map((value) => value.name) };
}

/** Well-known types have their own JSON form. */
function wellKnownSchema(message: DescMessage): JsonSchema | undefined {
  switch (message.typeName) {
    case "google.protobuf.Value":
      return {};
    case "google.protobuf.Struct":
      return { type: "object" };
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
