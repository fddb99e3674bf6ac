import type { Value } from "@bufbuild/protobuf/wkt";
import type { DecideRequest } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { isUuid } from "../validation.js";
import { FINITE_RULE, MAX_NESTING_DEPTH, PROTO_KEY_RULE, UNICODE_RULE, hasLoneSurrogate, pathOf, type Violation } from "../validation.js";

export const SUPPORTED_MODEL = "typesafe/service-1.13";
export const MAX_QUESTIONS = 40;
/** Two stages of 26 letters each bound what a choice can list. */
export const MAX_CHOICE_OPTIONS = 26 * 26;
/** Digits 0-9 up to 10 labels, letters A-Z from 11 to 26: every score label stays a single token. */
export const MAX_SCORE_LABELS = 26;
/** Question keys are printable and at most this many UTF-16 code units. */
export const MAX_KEY_LENGTH = 128;
/**
 * The question types the decision contract knows: the one list. A type added
 * here fails to compile until validation (CRITERIA_RULES), the engine's
 * specs (questionSpecs and every switch over QuestionSpec) and the OpenAPI
 * document (questionVariants) know it.
 */
export const QUESTION_TYPES = ["noul", "choice", "score"] as const;
export type QuestionType = (typeof QUESTION_TYPES)[number];

export function isQuestionType(type: string): type is QuestionType {
  return (QUESTION_TYPES as readonly string[]).includes(type);
}

/** For the compiler: a switch over QuestionType (or QuestionSpec) that reaches this has missed a case. */
export function unknownQuestionType(type: never): never {
  throw new Error(`unknown question type ${String(type)}`);
}

/**
 * The request rules of the decision contract, checked before any money moves.
 * The same function serves the JSON gateway and gRPC callers.
 */
export function validateDecideRequest(request: DecideRequest): Violation[] {
  const violations: Violation[] = [];
  if (request.model !== SUPPORTED_MODEL) {
    violations.push({ field: "model", rule: `must be "${SUPPORTED_MODEL}"` });
  }
  violations.push(...validateState(request.state));

  if (hasProtoKey(request.questions)) violations.push({ field: pathOf("questions", "__proto__"), rule: PROTO_KEY_RULE });
  const keys = Object.keys(request.questions);
  if (keys.length < 1 || keys.length > MAX_QUESTIONS) {
    violations.push({ field: "questions", rule: `must hold 1 to ${MAX_QUESTIONS} questions, got ${keys.length}` });
  }
  for (const key of keys) {
    const field = pathOf("questions", key);
    const question = request.questions[key]!;
    if (hasLoneSurrogate(key)) {
      violations.push({ field, rule: UNICODE_RULE });
      continue;
    }
    if (key.trim() === "" || key.length > MAX_KEY_LENGTH || /\p{Cc}/u.test(key)) {
      violations.push({ field, rule: `question keys must be 1 to ${MAX_KEY_LENGTH} printable characters` });
    }
    for (const [name, text] of [["type", question.type], ["instructions", question.instructions]] as const) {
      if (hasLoneSurrogate(text)) violations.push({ field: `${field}.${name}`, rule: UNICODE_RULE });
    }
    const type = question.type;
    if (!isQuestionType(type)) {
      violations.push({ field: `${field}.type`, rule: `must be one of ${QUESTION_TYPES.join(", ")}` });
      continue;
    }
    if (question.instructions.trim() === "") {
      violations.push({ field: `${field}.instructions`, rule: "must be a non-empty string" });
    }
    violations.push(...CRITERIA_RULES[type](presentValue(question.criteria), `${field}.criteria`));
    if (question.calibration !== "" && question.calibration !== "contextual" && !isUuid(question.calibration)) {
      violations.push({ field: `${field}.calibration`, rule: 'a calibration id (a UUID), "contextual", or absent' });
    }
  }
  return violations;
}

/** What each question type asks of its criteria. */
const CRITERIA_RULES: Record<QuestionType, (criteria: Value | undefined, field: string) => Violation[]> = {
  noul: (criteria, field) => (criteria ? [{ field, rule: "noul takes no criteria" }] : []),
  choice: (criteria, field) => validateChoiceCriteria(criteria, field),
  score: (criteria, field) => validateScoreCriteria(criteria, field),
};

/** A state is a non-empty text or a non-empty JSON object: numbers, booleans and arrays say nothing to decide on. */
function validateState(state: Value | undefined): Violation[] {
  const value = presentValue(state);
  if (!value) return [{ field: "state", rule: "is required: a text or a JSON object" }];
  switch (value.kind.case) {
    case "stringValue":
      if (hasLoneSurrogate(value.kind.value)) return [{ field: "state", rule: UNICODE_RULE }];
      return value.kind.value.trim() === "" ? [{ field: "state", rule: "must not be empty" }] : [];
    case "structValue": {
      const nested = findNestingViolation(value, "state", "state", 0);
      if (nested) return [nested];
      return Object.keys(value.kind.value.fields).length === 0 ? [{ field: "state", rule: "must not be empty" }] : [];
    }
    default:
      return [{ field: "state", rule: "must be a text or a JSON object" }];
  }
}

/**
 * The free-form rules the gateway checks on the JSON (json-shape.ts), again on
 * the decoded message for gRPC and Connect callers: a `__proto__` key (the
 * decoder keeps it as an own entry of the map object), nesting is
 * bounded, numbers are finite, texts and keys are valid Unicode, and every
 * value holds one (binary protobuf can send a Value with no kind set).
 */
function findNestingViolation(value: Value, at: string, root: string, depth: number): Violation | undefined {
  const kind = value.kind;
  if (kind.case === undefined) return { field: at, rule: "must hold a value: null, a number, a text, a boolean, an object or an array" };
  if (kind.case === "numberValue" && !Number.isFinite(kind.value)) return { field: at, rule: FINITE_RULE };
  if (kind.case === "stringValue") return hasLoneSurrogate(kind.value) ? { field: at, rule: UNICODE_RULE } : undefined;
  if (kind.case !== "structValue" && kind.case !== "listValue") return undefined;
  if (depth >= MAX_NESTING_DEPTH) return { field: root, rule: `nesting deeper than ${MAX_NESTING_DEPTH} levels` };
  if (kind.case === "listValue") {
    for (const [index, item] of kind.value.values.entries()) {
      const violation = findNestingViolation(item, `${at}[${index}]`, root, depth + 1);
      if (violation) return violation;
    }
    return undefined;
  }
  if (hasProtoKey(kind.value.fields)) return { field: pathOf(at, "__proto__"), rule: PROTO_KEY_RULE };
  for (const [key, item] of Object.entries(kind.value.fields)) {
    if (hasLoneSurrogate(key)) return { field: pathOf(at, key), rule: UNICODE_RULE };
    const violation = findNestingViolation(item, pathOf(at, key), root, depth + 1);
    if (violation) return violation;
  }
  return undefined;
}

/** True when the map holds a `__proto__` key: protobuf-es 2.17 decodes one as an own entry, never as the object's prototype. */
function hasProtoKey(map: object): boolean {
  return Object.hasOwn(map, "__proto__");
}

/** Labels and option names the prompt would show alike (whitespace only differs) are duplicates; case still counts. */
function labelKey(text: string): string {
  return text.replace(/\s+/gu, " ").trim().normalize("NFC");
}

function validateChoiceCriteria(criteria: Value | undefined, field: string): Violation[] {
  const rule = `choice needs an object of at least 2 options, each mapped to null`;
  if (criteria?.kind.case !== "structValue") return [{ field, rule }];
  const options = criteria.kind.value.fields;
  if (hasProtoKey(options)) return [{ field: pathOf(field, "__proto__"), rule: PROTO_KEY_RULE }];
  const names = Object.keys(options);
  if (names.length < 2) return [{ field, rule }];
  if (names.length > MAX_CHOICE_OPTIONS) {
    return [{ field, rule: `choice takes at most ${MAX_CHOICE_OPTIONS} options, got ${names.length}` }];
  }
  const seen = new Map<string, string>();
  for (const name of names) {
    if (hasLoneSurrogate(name)) return [{ field: pathOf(field, name), rule: UNICODE_RULE }];
    if (name.trim() === "") return [{ field: pathOf(field, name), rule: "option names must not be empty" }];
    if (options[name]!.kind.case !== "nullValue") {
      return [{ field: pathOf(field, name), rule: "options must map to null" }];
    }
    const first = seen.get(labelKey(name));
    if (first !== undefined) {
      return [{ field: pathOf(field, name), rule: `duplicate option: same as ${JSON.stringify(first)} apart from whitespace` }];
    }
    seen.set(labelKey(name), name);
  }
  return [];
}

function validateScoreCriteria(criteria: Value | undefined, field: string): Violation[] {
  const rule = "score needs an array of at least 2 distinct non-empty labels, lowest first";
  if (criteria?.kind.case !== "listValue") return [{ field, rule }];
  const labels = criteria.kind.value.values;
  if (labels.length < 2) return [{ field, rule }];
  if (labels.length > MAX_SCORE_LABELS) {
    return [{ field, rule: `score takes at most ${MAX_SCORE_LABELS} labels, got ${labels.length}` }];
  }
  const seen = new Map<string, number>();
  for (const [index, label] of labels.entries()) {
    const at = `${field}[${index}]`;
    if (label.kind.case !== "stringValue" || label.kind.value.trim() === "") {
      return [{ field: at, rule: "labels must be non-empty strings" }];
    }
    if (hasLoneSurrogate(label.kind.value)) return [{ field: at, rule: UNICODE_RULE }];
    const first = seen.get(labelKey(label.kind.value));
    if (first !== undefined) {
      return [{ field: at, rule: `duplicate label ${JSON.stringify(label.kind.value)}: same as [${first}] apart from whitespace` }];
    }
    seen.set(labelKey(label.kind.value), index);
  }
  return [];
}

/** A Value that is absent or JSON null counts as not given. */
function presentValue(value: Value | undefined): Value | undefined {
  if (!value || value.kind.case === undefined || value.kind.case === "nullValue") return undefined;
  return value;
}
