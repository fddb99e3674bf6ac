import { fromJson, toJson, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema, type Value } from "@bufbuild/protobuf/wkt";
import { Readable } from "node:stream";
import { finished } from "node:stream/promises";
import { CsvError, parse as parseCsv } from "csv-parse";
import { SUPPORTED_MODEL, validateDecideRequest } from "../decision/validate.js";
import { promptTooLong, questionSpecs } from "../decision/service.js";
import { renderState } from "../decision/prompt.js";
import type { QuestionSpec } from "../decision/engine.js";
import { DecideRequestSchema, type Question } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { create } from "@bufbuild/protobuf";
import { pathOf, type Violation } from "../validation.js";

/** Examples one evaluation may hold. */
export const MAX_EXAMPLES = 10_000;
/** The longest line of an examples file (a state is at most a prompt's budget, far below this). */
export const MAX_LINE_BYTES = 512 * 1024;

/**
 * One example as the caller sent it, with the 1-based line (or position) it came from. The state
 * is kept as its JSON text: a file's examples are all held until their one transaction, and a
 * text takes a fraction of the memory of the same state as objects.
 */
export interface ExampleInput {
  line: number;
  state: string | undefined;
  labels: Record<string, Value>;
}

/** One example ready to store: the state as JSON text, and each label as a boolean or a text. */
export interface ValidExample {
  position: number;
  state: string;
  labels: Record<string, boolean | string>;
}

/** An example of a CreateEvaluation request, at its 1-based position. */
export function exampleFromMessage(example: { state?: Value; labels: Record<string, Value> }, position: number): ExampleInput {
  return { line: position, state: example.state === undefined ? undefined : JSON.stringify(toJson(ValueSchema, example.state)), labels: example.labels };
}

/** A broken rule of an examples set: the line, the field on that line, the rule. */
export interface ExampleViolation extends Violation {
  /** 0 for the question set or the set as a whole. */
  line: number;
}

/**
 * Checks a question set and its examples as a decision would check them (the
 * same validation, the same prompt-size rule, the same field names), plus the
 * labels: each names a question key and holds an answer that question can
 * give. Every violation is reported, each with its line; nothing is valid
 * unless all are.
 */
export function validateEvaluation(
  questions: Record<string, Question>,
  examples: readonly ExampleInput[],
): { questions: QuestionSpec[]; examples: ValidExample[]; violations: ExampleViolation[] } {
  const violations: ExampleViolation[] = [];
  const questionViolations = validateDecideRequest(create(DecideRequestSchema, { model: SUPPORTED_MODEL, questions, state: { kind: { case: "stringValue", value: "-" } } }));
  // An evaluation measures the raw answers (and calibrations are fitted from them), so its questions name none.
  for (const [key, question] of Object.entries(questions)) {
    if (question.calibration !== "") questionViolations.push({ field: `${pathOf("questions", key)}.calibration`, rule: "an evaluation measures raw answers: no calibration" });
  }
  for (const v of questionViolations) violations.push({ line: 0, ...v });
  if (examples.length < 1 || examples.length > MAX_EXAMPLES) {
    violations.push({ line: 0, field: "examples", rule: `must hold 1 to ${MAX_EXAMPLES} examples, got ${examples.length}` });
  }
  if (questionViolations.length > 0) return { questions: [], examples: [], violations };
  const specs = questionSpecs(create(DecideRequestSchema, { questions }));
  const byKey = new Map(specs.map((spec) => [spec.key, spec]));
  const valid: ValidExample[] = [];
  for (const example of examples) {
    const before = violations.length;
    // The state as a message only while its example is checked.
    const state = example.state === undefined ? undefined : fromJson(ValueSchema, JSON.parse(example.state) as JsonValue);
    for (const v of validateDecideRequest(create(DecideRequestSchema, { model: SUPPORTED_MODEL, questions, state }))) {
      if (!v.field.startsWith("questions")) violations.push({ line: example.line, ...v });
    }
    if (violations.length === before) {
      const tooLong = promptTooLong(renderState(state!), specs);
      if (tooLong) violations.push({ line: example.line, field: "state", rule: `with ${tooLong.field}, ${tooLong.message}` });
    }
    const labels: Record<string, boolean | string> = {};
    const keys = Object.keys(example.labels);
    if (keys.length === 0) violations.push({ line: example.line, field: "labels", rule: "must label at least one question" });
    for (const key of keys) {
      const field = pathOf("labels", key);
      const spec = byKey.get(key);
      if (!spec) {
        violations.push({ line: example.line, field, rule: `not a question key (${[...byKey.keys()].join(", ")})` });
        continue;
      }
      const label = labelOf(spec, example.labels[key]!);
      if (typeof label === "object") violations.push({ line: example.line, field, rule: label.rule });
      else labels[key] = label;
    }
    if (violations.length === before) valid.push({ position: example.line, state: example.state!, labels });
  }
  return { questions: specs, examples: violations.length === 0 ? valid : [], violations };
}

/** The expected answer a label gives, or the rule it breaks. */
function labelOf(spec: QuestionSpec, value: Value): boolean | string | { rule: string } {
  const kind = value.kind;
  switch (spec.type) {
    case "noul":
      return kind.case === "boolValue" ? kind.value : { rule: "a noul label must be true or false" };
    case "choice":
      return kind.case === "stringValue" && spec.options.includes(kind.value) ? kind.value : { rule: `must be one of the options: ${listed(spec.options)}` };
    case "score":
      return kind.case === "stringValue" && spec.labels.includes(kind.value) ? kind.value : { rule: `must be one of the labels: ${listed(spec.labels)}` };
  }
}

function listed(names: readonly string[]): string {
  const shown = names.slice(0, 10).map((n) => JSON.stringify(n));
  return names.length > 10 ? `${shown.join(", ")}, … (${names.length} in all)` : shown.join(", ");
}

/** The largest examples file read, on every door: 10,000 examples of a few KB each fit many times over, and the parsed set is held until it is stored whole. */
export const MAX_EXAMPLES_FILE_BYTES = 64 * 1024 * 1024;

/** How a file's violation is named on the doors that read files (the CLI, the upload route): `line 4: labels.urgent`. */
export function fileLineField(violation: ExampleViolation): string {
  if (violation.line === 0) return violation.field;
  return violation.field === "" ? `line ${violation.line}` : `line ${violation.line}: ${violation.field}`;
}

/**
 * Reads an examples file as it arrives, a line at a time: JSON Lines
 * (`{"state": …, "labels": {"key": …}}` per line) or CSV (a header
 * `state,<key>,<key>…`; an empty cell labels nothing; `true`/`false` for
 * noul; a state cell that is a JSON object is read as one). Blank lines are
 * skipped; line numbers are the file's. Only the parsed examples are kept,
 * never the text; past MAX_EXAMPLES the rest is read and thrown away, so the
 * source always ends (a door's body is never left half-read).
 */
export async function parseExamples(
  source: AsyncIterable<Uint8Array | string>,
  format: "jsonl" | "csv",
  questions: Record<string, Question>,
): Promise<{ examples: ExampleInput[]; violations: ExampleViolation[] }> {
  return format === "jsonl" ? parseJsonLines(source) : parseCsvExamples(source, questions);
}

/** A source's lines, a chunk's worth at a time, as they arrive; a line over MAX_LINE_BYTES is given as undefined (its text is never held whole). */
async function* linesOf(source: AsyncIterable<Uint8Array | string>): AsyncGenerator<Array<string | undefined>> {
  const decoder = new TextDecoder("utf-8");
  let partial = "";
  let tooLong = false;
  const take = (text: string): Array<string | undefined> => {
    const lines: Array<string | undefined> = [];
    let from = 0;
    for (let at = text.indexOf("\n"); at !== -1; at = text.indexOf("\n", from)) {
      const piece = partial + text.slice(from, at);
      lines.push(tooLong || Buffer.byteLength(piece) > MAX_LINE_BYTES ? undefined : piece);
      partial = "";
      tooLong = false;
      from = at + 1;
    }
    if (!tooLong) {
      partial += text.slice(from);
      if (partial.length > MAX_LINE_BYTES) {
        tooLong = true;
        partial = "";
      }
    }
    return lines;
  };
  for await (const chunk of source) yield take(typeof chunk === "string" ? chunk : decoder.decode(chunk, { stream: true }));
  yield take(decoder.decode() + "\n");
}

async function parseJsonLines(source: AsyncIterable<Uint8Array | string>): Promise<{ examples: ExampleInput[]; violations: ExampleViolation[] }> {
  const examples: ExampleInput[] = [];
  const violations: ExampleViolation[] = [];
  let line = 0;
  let full = false;
  for await (const lines of linesOf(source)) {
    for (const raw of lines) {
      line += 1;
      if (full || (raw !== undefined && raw.trim() === "")) continue;
      if (examples.length + violations.length >= MAX_EXAMPLES) {
        violations.push({ line, field: "examples", rule: `at most ${MAX_EXAMPLES} examples` });
        full = true;
        continue;
      }
      if (raw === undefined) {
        violations.push({ line, field: "", rule: `a line is at most ${MAX_LINE_BYTES} bytes` });
        continue;
      }
      let parsed: unknown;
      try {
        parsed = JSON.parse(raw);
      } catch {
        violations.push({ line, field: "", rule: "must be one JSON object" });
        continue;
      }
      const example = exampleFromJson(parsed, line);
      if ("rule" in example) violations.push(example);
      else examples.push(example);
    }
  }
  return { examples, violations };
}

/** A JSON example (`{state, labels}`) as protobuf Values, or the rule its shape breaks. */
export function exampleFromJson(parsed: unknown, line: number): ExampleInput | ExampleViolation {
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) return { line, field: "", rule: "must be a JSON object with state and labels" };
  const { state, labels, ...rest } = parsed as Record<string, unknown>;
  const extra = Object.keys(rest)[0];
  if (extra !== undefined) return { line, field: extra, rule: "unknown field: an example has state and labels" };
  if (typeof labels !== "object" || labels === null || Array.isArray(labels)) return { line, field: "labels", rule: "must be an object of question key to expected answer" };
  try {
    const values: Record<string, Value> = {};
    for (const [key, label] of Object.entries(labels)) values[key] = fromJson(ValueSchema, label as JsonValue);
    return { line, state: state === undefined ? undefined : JSON.stringify(state), labels: values };
  } catch {
    return { line, field: "state", rule: "must be valid JSON values" };
  }
}

async function parseCsvExamples(source: AsyncIterable<Uint8Array | string>, questions: Record<string, Question>): Promise<{ examples: ExampleInput[]; violations: ExampleViolation[] }> {
  const examples: ExampleInput[] = [];
  const violations: ExampleViolation[] = [];
  const parser = parseCsv({ info: true, relax_column_count: true, skip_empty_lines: true, bom: true, max_record_size: MAX_LINE_BYTES });
  const input = Readable.from(source, { objectMode: false });
  input.on("error", (err) => parser.destroy(err));
  input.pipe(parser);
  let header: string[] | undefined;
  let full = false;
  try {
    for await (const { record, info } of parser as AsyncIterable<{ record: string[]; info: { lines: number } }>) {
      const line = info.lines;
      if (full) continue;
      if (!header) {
        header = record;
        if (header[0] !== "state") {
          violations.push({ line: 1, field: "", rule: "the header must start with state, then question keys" });
          full = true;
        }
        for (const key of header.slice(1)) {
          if (!Object.hasOwn(questions, key)) violations.push({ line: 1, field: key, rule: "not a question key" });
        }
        full ||= violations.length > 0;
        continue;
      }
      if (examples.length + violations.length >= MAX_EXAMPLES) {
        violations.push({ line, field: "examples", rule: `at most ${MAX_EXAMPLES} examples` });
        full = true;
        continue;
      }
      if (record.length !== header.length) {
        violations.push({ line, field: "", rule: `has ${record.length} cells; the header has ${header.length}` });
        continue;
      }
      const labels: Record<string, Value> = {};
      for (const [i, key] of header.entries()) {
        if (i === 0 || record[i] === "") continue;
        const cell = record[i]!;
        const type = questions[key]!.type;
        labels[key] = fromJson(ValueSchema, type === "noul" && (cell === "true" || cell === "false") ? cell === "true" : cell);
      }
      examples.push({ line, state: stateCell(record[0]!), labels });
    }
  } catch (err) {
    // The source's own failure (a body cut, over its bound) is the door's to report, not a CSV rule.
    if (!(err instanceof CsvError)) throw err;
    input.unpipe(parser);
    input.resume();
    await finished(input).catch(() => undefined);
    const line = (err as CsvError & { lines?: number }).lines ?? 0;
    violations.push({ line, field: "", rule: err.code === "CSV_MAX_RECORD_SIZE" ? `a line is at most ${MAX_LINE_BYTES} bytes` : "not valid CSV (RFC 4180): check the quotes" });
    return { examples: [], violations };
  }
  if (!header) violations.push({ line: 1, field: "", rule: "the header must start with state, then question keys" });
  return { examples: violations.length === 0 ? examples : [], violations };
}

/** A state cell, as JSON text: a JSON object when it reads as one, the text otherwise. */
function stateCell(cell: string): string {
  if (cell.trimStart().startsWith("{")) {
    try {
      return JSON.stringify(JSON.parse(cell));
    } catch {
      return JSON.stringify(cell);
    }
  }
  return JSON.stringify(cell);
}
