import type { DescField, DescMessage } from "@bufbuild/protobuf";
import { ScalarType } from "@bufbuild/protobuf";
import { pathOf, type Violation } from "../validation.js";

/**
 * Walks a parsed JSON body along a message descriptor and names the first
 * unknown field or wrong JSON type with its full path
 * (`questions.q1.instuctions: unknown field`). protobuf-es's fromJson rejects
 * the same bodies, but its messages lose the path of nested fields.
 */
export function findShapeViolation(desc: DescMessage, json: unknown, path = ""): Violation | undefined {
  if (desc.typeName === "google.protobuf.Value") return undefined;
  if (!isObject(json)) return { field: path || "body", rule: "must be a JSON object" };
  for (const [key, value] of Object.entries(json)) {
    const at = path ? pathOf(path, key) : key;
    const field = desc.fields.find((f) => f.jsonName === key || f.name === key);
    if (!field) return { field: at, rule: "unknown field" };
    if (value === null) continue;
    const violation = checkField(field, value, at);
    if (violation) return violation;
  }
  return undefined;
}

function checkField(field: DescField, value: unknown, at: string): Violation | undefined {
  switch (field.fieldKind) {
    case "scalar":
      return checkScalar(field.scalar, value, at);
    case "enum":
      return typeof value === "string" || typeof value === "number" ? undefined : { field: at, rule: "must be a string" };
    case "message":
      return findShapeViolation(field.message, value, at);
    case "list": {
      if (!Array.isArray(value)) return { field: at, rule: "must be an array" };
      for (const [index, item] of value.entries()) {
        const itemAt = `${at}[${index}]`;
        const violation =
          field.listKind === "message"
            ? findShapeViolation(field.message, item, itemAt)
            : field.listKind === "scalar"
              ? checkScalar(field.scalar, item, itemAt)
              : undefined;
        if (violation) return violation;
      }
      return undefined;
    }
    case "map": {
      if (!isObject(value)) return { field: at, rule: "must be a JSON object" };
      for (const [key, item] of Object.entries(value)) {
        const itemAt = pathOf(at, key);
        const violation =
          field.mapKind === "message"
            ? findShapeViolation(field.message, item, itemAt)
            : field.mapKind === "scalar"
              ? checkScalar(field.scalar, item, itemAt)
              : undefined;
        if (violation) return violation;
      }
      return undefined;
    }
  }
}

function checkScalar(type: ScalarType, value: unknown, at: string): Violation | undefined {
  switch (type) {
    case ScalarType.STRING:
      return typeof value === "string" ? undefined : { field: at, rule: "must be a string" };
    case ScalarType.BOOL:
      return typeof value === "boolean" ? undefined : { field: at, rule: "must be a boolean" };
    case ScalarType.BYTES:
      return typeof value === "string" ? undefined : { field: at, rule: "must be a base64 string" };
    default:
      return typeof value === "number" || typeof value === "string" ? undefined : { field: at, rule: "must be a number" };
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
