import { SourceFailure } from "./source-failure.js";

/**
 * Reading provider JSON, which is untrusted: every field is read defensively,
 * and a wrong top-level shape is an error rather than an empty answer.
 */

/** The value as an object, or undefined when it is not one (arrays and null are not). */
export function asRecord(value: unknown): Record<string, unknown> | undefined {
  return typeof value === "object" && value !== null && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined;
}
/** The value as an array, or an empty one. */
export function asArray(value: unknown): unknown[] {
  return Array.isArray(value) ? value : [];
}
/** The value as a string, or an empty one. */
export function asString(value: unknown): string {
  return typeof value === "string" ? value : "";
}
/** The value as a finite number, or undefined. */
export function asNumber(value: unknown): number | undefined {
  return typeof value === "number" && Number.isFinite(value) ? value : undefined;
}

/**
 * Unix seconds from a provider as ISO-8601, or null when they are not a
 * time Date can represent (e.g. 1e20): one odd item must not fail the answer.
 */
export function isoFromUnixSeconds(value: unknown): string | null {
  const seconds = asNumber(value);
  if (seconds === undefined) return null;
  const date = new Date(seconds * 1000);
  return Number.isNaN(date.getTime()) ? null : date.toISOString();
}

/** Fixed reason for an answer whose top-level shape is not the provider's documented one. */
export const UNEXPECTED_SHAPE = "upstream answer has an unexpected shape";

/**
 * Guards for the top-level shape of an answer. A wrong shape (`"hits": null`,
 * a missing list) means we cannot tell "no results" from "something else
 * answered", so it is an error, never an empty (and charged) answer.
 */
export function requireRecord(value: unknown): Record<string, unknown> {
  const record = asRecord(value);
  if (!record) throw new SourceFailure("error", UNEXPECTED_SHAPE);
  return record;
}
/** The value as an array; anything else fails the answer as an unexpected shape. */
export function requireArray(value: unknown): unknown[] {
  if (!Array.isArray(value)) throw new SourceFailure("error", UNEXPECTED_SHAPE);
  return value;
}
/** A list the provider omits when it has nothing to say (Brave's `web`, GDELT's `articles`); present, it must be a list. */
export function optionalArray(value: unknown): unknown[] {
  return value === undefined ? [] : requireArray(value);
}
/** An object the provider omits when it has nothing to say; present, it must be an object. */
export function optionalRecord(value: unknown): Record<string, unknown> {
  return value === undefined ? {} : requireRecord(value);
}
