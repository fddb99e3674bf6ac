import { ScalarType, type DescMessage, type Message } from "@bufbuild/protobuf";
import { isReflectMessage, reflect, type ReflectMessage } from "@bufbuild/protobuf/reflect";
import { apiError } from "./errors.js";

/**
 * How deeply free-form JSON (a `state`, a `criteria`) may nest objects and
 * arrays. Far above any real state, far below protobuf-es's recursion limit,
 * so a deep body is refused with its field named instead of a generic error.
 */
export const MAX_NESTING_DEPTH = 32;

/** The rule broken by a key named `__proto__`: JavaScript maps would turn it into a prototype and drop it. */
export const PROTO_KEY_RULE = '"__proto__" is not allowed as a key';

/** Text with a lone UTF-16 surrogate (a JSON "\udc00" escape) cannot be sent on as UTF-8. */
export const UNICODE_RULE = "must be valid Unicode text (no lone surrogates)";
/** JSON.parse reads 1e999 as Infinity, which a google.protobuf.Value cannot print back. */
export const FINITE_RULE = "must be a finite number";

export function hasLoneSurrogate(text: string): boolean {
  return /\p{Cs}/u.test(text);
}

/** The rule of every text a caller sends that may be stored: PostgreSQL's text holds no U+0000, and UTF-8 no lone surrogate. */
export const STORABLE_TEXT_RULE = "must be text without U+0000 or lone surrogates";

/**
 * Every string of a decoded request (nested messages, lists and map keys and
 * values included) that breaks STORABLE_TEXT_RULE, named by its JSON path.
 * Run on the message, so JSON, binary and gRPC callers meet the same rule.
 */
export function storableTextViolations(schema: DescMessage, message: Message, at = ""): Violation[] {
  return textViolationsOf(reflect(schema, message), at);
}

function textViolationsOf(message: ReflectMessage, at: string): Violation[] {
  const violations: Violation[] = [];
  const check = (value: unknown, path: string) => {
    if (typeof value === "string" && /[\u0000\p{Cs}]/u.test(value)) violations.push({ field: path, rule: STORABLE_TEXT_RULE });
    else if (isReflectMessage(value)) violations.push(...textViolationsOf(value, path));
  };
  for (const field of message.fields) {
    if (!message.isSet(field)) continue;
    const path = at === "" ? field.name : `${at}.${field.name}`;
    if (field.fieldKind === "scalar" && field.scalar === ScalarType.STRING) check(message.get(field), path);
    else if (field.fieldKind === "message") check(message.get(field), path);
    else if (field.fieldKind === "list") {
      let index = 0;
      for (const item of message.get(field)) check(item, `${path}[${index++}]`);
    } else if (field.fieldKind === "map") {
      for (const [key, value] of message.get(field)) {
        const entry = pathOf(path, String(key));
        if (typeof key === "string") check(key, entry);
        check(value, entry);
      }
    }
  }
  return violations;
}

/** One broken rule: the JSON path the caller sent, and the rule in words. */
export interface Violation {
  field: string;
  rule: string;
}

/** Throws a 400 naming the first violation (field path and rule), if any. */
export function throwIfInvalid(violations: Violation[]): void {
  const first = violations[0];
  if (!first) return;
  throw apiError("INVALID_ARGUMENT", `${first.field}: ${first.rule}`, {
    field: first.field,
    rule: first.rule,
    metadata: violations.length > 1 ? { more_violations: String(violations.length - 1) } : {},
  });
}

/**
 * JSON path of a map entry: `questions.q3`, or `questions["odd key"]` when the
 * key needs quoting; at the top level `q3` or `[""]`, so even an empty key is named.
 */
export function pathOf(parent: string, key: string): string {
  if (/^[A-Za-z_][A-Za-z0-9_-]*$/.test(key)) return parent === "" ? key : `${parent}.${key}`;
  return `${parent}[${JSON.stringify(key)}]`;
}

/** True for a UUID in its text form, the shape of account and key ids (a cast of anything else would fail in SQL). */
export function isUuid(text: string): boolean {
  return /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(text);
}
