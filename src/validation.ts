import { apiError } from "./errors.js";

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

/** JSON path of a map entry: `questions.q3`, or `questions["odd key"]` when the key needs quoting. */
export function pathOf(parent: string, key: string): string {
  return /^[A-Za-z_][A-Za-z0-9_-]*$/.test(key) ? `${parent}.${key}` : `${parent}[${JSON.stringify(key)}]`;
}
