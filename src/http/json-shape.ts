import type { DescField, DescMessage } from "@bufbuild/protobuf";
import { ScalarType } from "@bufbuild/protobuf";
import { FINITE_RULE, MAX_NESTING_DEPTH, PROTO_KEY_RULE, UNICODE_RULE, hasLoneSurrogate, pathOf, type Violation } from "../validation.js";

/** Well-known types whose JSON is free-form: any keys, any nesting. */
const FREE_FORM_TYPES = new Set(["google.protobuf.Value", "google.protobuf.Struct", "google.protobuf.ListValue"]);

/** Well-known types whose JSON is a string (RFC 3339 time, "1.5s", "a,b"), parsed by fromJson. */
const STRING_FORM_TYPES = new Set(["google.protobuf.Timestamp", "google.protobuf.Duration", "google.protobuf.FieldMask"]);

/**
 * Walks a parsed JSON body along a message descriptor and names the first
 * unknown field, wrong JSON type, `__proto__` key, lone surrogate, infinite
 * number or too deep nesting with its full path (`questions.q1.instuctions: unknown field`).
 * protobuf-es's fromJson rejects most of these bodies, but its messages lose
 * the path; and it silently drops `__proto__` keys (assigning one into a map
 * object sets the prototype), so they must be refused here.
 */
export function findShapeViolation(desc: DescMessage, json: unknown, path = ""): Violation | undefined {
  if (FREE_FORM_TYPES.has(desc.typeName)) return findFreeFormViolation(json, path || "body", path || "body", 0);
  if (STRING_FORM_TYPES.has(desc.typeName)) return typeof json === "string" ? checkText(json, path || "body") : { field: path || "body", rule: "must be a string" };
  if (!isObject(json)) return { field: path || "body", rule: "must be a JSON object" };
  for (const [key, value] of Object.entries(json)) {
    const at = pathOf(path, key);
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
      if (typeof value === "string") return checkText(value, at);
      return typeof value === "number" ? undefined : { field: at, rule: "must be a string" };
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
          checkKey(key, itemAt) ??
          (field.mapKind === "message"
            ? findShapeViolation(field.message, item, itemAt)
            : field.mapKind === "scalar"
              ? checkScalar(field.scalar, item, itemAt)
              : undefined);
        if (violation) return violation;
      }
      return undefined;
    }
  }
}

/** Free-form JSON: keys and texts as anywhere else; nesting is reported at the field itself (`state`). */
function findFreeFormViolation(json: unknown, at: string, root: string, depth: number): Violation | undefined {
  if (typeof json === "string") return checkText(json, at);
  if (typeof json === "number") return Number.isFinite(json) ? undefined : { field: at, rule: FINITE_RULE };
  if (typeof json !== "object" || json === null) return undefined;
  if (depth >= MAX_NESTING_DEPTH) return { field: root, rule: `nesting deeper than ${MAX_NESTING_DEPTH} levels` };
  if (Array.isArray(json)) {
    for (const [index, item] of json.entries()) {
      const violation = findFreeFormViolation(item, `${at}[${index}]`, root, depth + 1);
      if (violation) return violation;
    }
    return undefined;
  }
  for (const [key, item] of Object.entries(json)) {
    const itemAt = pathOf(at, key);
    const violation = checkKey(key, itemAt) ?? findFreeFormViolation(item, itemAt, root, depth + 1);
    if (violation) return violation;
  }
  return undefined;
}

function checkKey(key: string, at: string): Violation | undefined {
  if (key === "__proto__") return { field: at, rule: PROTO_KEY_RULE };
  return checkText(key, at);
}

function checkText(text: string, at: string): Violation | undefined {
  return hasLoneSurrogate(text) ? { field: at, rule: UNICODE_RULE } : undefined;
}

function checkScalar(type: ScalarType, value: unknown, at: string): Violation | undefined {
  switch (type) {
    case ScalarType.STRING:
      return typeof value === "string" ? checkText(value, at) : { field: at, rule: "must be a string" };
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
