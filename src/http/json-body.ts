import { isUtf8 } from "node:buffer";
import { fromJson, type DescMessage, type JsonValue, type MessageShape } from "@bufbuild/protobuf";
import type { ConnectError } from "@connectrpc/connect";
import { apiError } from "../errors.js";
import { SearchRequestSchema } from "../gen/typesafe/search/v1/search_service_pb.js";
import { findSearchJsonViolation } from "../search/validate.js";
import { throwIfInvalid, type Violation } from "../validation.js";
import { findShapeViolation } from "./json-shape.js";

/**
 * Rules of a request's JSON form that its message cannot express (an explicit
 * empty list is lost once decoded), by message type: registered once here,
 * applied by every door that takes JSON.
 */
const JSON_RULES: Readonly<Record<string, (json: Record<string, unknown>) => Violation | undefined>> = {
  [SearchRequestSchema.typeName]: findSearchJsonViolation,
};

/** The one error for a body that is not JSON (or not UTF-8, which JSON must be). */
export function malformedJson(): ConnectError {
  return apiError("MALFORMED_JSON", "body: must be valid JSON", { field: "body", rule: "valid JSON" });
}

/** Parses a JSON body; throws MALFORMED_JSON. */
export function parseJsonBody(bytes: Uint8Array): unknown {
  if (!isUtf8(bytes)) throw malformedJson();
  try {
    return JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("utf8"));
  } catch {
    throw malformedJson();
  }
}

/**
 * The first rule a parsed JSON body breaks for a request of type `desc`: its
 * shape (unknown field, wrong JSON type, `__proto__` key, lone surrogate, too
 * deep nesting, with the field's path), then the rules registered for the type.
 */
export function findJsonViolation(desc: DescMessage, json: unknown): Violation | undefined {
  return findShapeViolation(desc, json) ?? JSON_RULES[desc.typeName]?.(json as Record<string, unknown>);
}

/**
 * A parsed JSON body as the request message of type `desc`, or the caller's
 * 400: the first broken shape rule with its field, else (a number out of an
 * integer's range, a malformed timestamp) the schema's refusal naming the
 * body. Every door that takes JSON decodes through here, so all give the
 * same answer.
 */
export function decodeJsonRequest<Desc extends DescMessage>(desc: Desc, json: unknown): MessageShape<Desc> {
  const violation = findJsonViolation(desc, json);
  throwIfInvalid(violation ? [violation] : []);
  try {
    return fromJson(desc, json as JsonValue);
  } catch (err) {
    throw apiError("INVALID_ARGUMENT", "body: does not match the request schema", {
      field: "body",
      rule: "must match the request schema",
      cause: err,
    });
  }
}
