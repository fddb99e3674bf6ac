import { create } from "@bufbuild/protobuf";
import type { Knex } from "knex";
import { apiError } from "../errors.js";
import { applyCalibration, type CalibrationParams } from "../evaluation/calibration-apply.js";
import { signatureMismatch, signatureOf } from "../evaluation/calibration-signature.js";
import { findCalibrations, type DbCalibrationRow } from "../evaluation/calibration-store.js";
import { CalibratedAnswerSchema, type Answer, type CalibratedAnswer } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { pathOf } from "../validation.js";
import { argmax, expectedLevel, round6 } from "./answer-math.js";
import type { QuestionSpec } from "./engine.js";

/** Calibrations kept in memory per process; they never change, so a hit is never stale. */
export const MAX_CACHED_CALIBRATIONS = 1000;

/**
 * Calibrations by id, bounded: the oldest entry leaves when a new one would
 * exceed the bound. Rows are immutable, so nothing is ever invalidated; a
 * calibration of another account is in the map but never served to it.
 */
export interface CalibrationCache {
  get(id: string): DbCalibrationRow | undefined;
  put(row: DbCalibrationRow): void;
}

export function createCalibrationCache(maxEntries = MAX_CACHED_CALIBRATIONS): CalibrationCache {
  const rows = boundedMap<DbCalibrationRow>(maxEntries);
  return { get: (id) => rows.get(id), put: (row) => rows.set(row.id, row) };
}

/** The state of a contextual calibration's probe: it carries nothing that favours any label (Zhao et al. 2021). */
export const CONTENT_FREE_STATE = "N/A";
/** The value of Question.calibration that asks for contextual calibration. */
export const CONTEXTUAL = "contextual";

/**
 * The answers to the content-free state, by question signature digest,
 * bounded: each signature is probed once per process while it stays in the
 * map. A probe depends only on the signature, which names the prompt version
 * and the upstream model, so a kept one never goes stale.
 */
export interface ProbeCache {
  get(digest: string): number[] | undefined;
  put(digest: string, probe: number[]): void;
}

export function createProbeCache(maxEntries = MAX_CACHED_CALIBRATIONS): ProbeCache {
  const probes = boundedMap<number[]>(maxEntries);
  return { get: (digest) => probes.get(digest), put: (digest, probe) => probes.set(digest, probe) };
}

function boundedMap<V>(maxEntries: number): { get(key: string): V | undefined; set(key: string, value: V): void } {
  const entries = new Map<string, V>();
  return {
    get: (key) => entries.get(key),
    set(key, value) {
      entries.delete(key);
      entries.set(key, value);
      if (entries.size > maxEntries) entries.delete(entries.keys().next().value!);
    },
  };
}

/** An answer's label probabilities in label order ([p(true), p(false)] for noul); none for an answer of another type. */
export function labelDistribution(spec: QuestionSpec, answer: { type?: string; noul?: number; probabilities?: Record<string, number> }): number[] | undefined {
  if (answer.type !== spec.type) return undefined;
  switch (spec.type) {
    case "noul":
      return [answer.noul ?? 0, 1 - (answer.noul ?? 0)];
    case "choice":
      return spec.options.map((name) => answer.probabilities?.[name] ?? 0);
    case "score":
      return spec.labels.map((_, i) => answer.probabilities?.[String(i)] ?? 0);
  }
}

/** What the service asks with now: a calibration applies only to answers read the same way. */
export interface AskedWith {
  promptVersion: string;
  model: string;
  upstream: string;
}

/**
 * The calibration of each question that names one, checked before anything
 * is held: an id of no calibration of this account is a 404 that says no more
 * than that, and one whose signature differs from the question's is a 400
 * naming `questions.<key>.calibration` and the part that differs. Reads the
 * missing ids in one primary-key query.
 */
export async function calibrationsOf(
  db: Knex,
  cache: CalibrationCache,
  accountId: string,
  wanted: ReadonlyArray<{ spec: QuestionSpec; calibrationId: string }>,
  asked: AskedWith,
): Promise<Map<string, DbCalibrationRow>> {
  const missing = [...new Set(wanted.map((w) => w.calibrationId).filter((id) => !cache.get(id)))];
  if (missing.length > 0) for (const row of await findCalibrations(db, accountId, missing)) cache.put(row);
  const byKey = new Map<string, DbCalibrationRow>();
  for (const { spec, calibrationId } of wanted) {
    const field = `${pathOf("questions", spec.key)}.calibration`;
    const row = cache.get(calibrationId);
    if (!row || row.account_id !== accountId) throw apiError("NOT_FOUND", "no such calibration", { field });
    const differs = signatureMismatch(
      { type: row.question_type, instructions: row.instructions, labels: row.labels, promptVersion: row.prompt_version, model: row.model, upstream: row.upstream },
      signatureOf(spec, asked),
    );
    if (differs) {
      const rule = "the calibration's signature (type, instructions, options or labels, prompt version, model, upstream) must match the question";
      throw apiError("INVALID_ARGUMENT", `${field}: the question's ${differs} differs from the calibration's`, {
        field,
        rule,
        metadata: { differs, calibration_id: row.id },
      });
    }
    byKey.set(spec.key, row);
  }
  return byKey;
}

/** The calibrated answer beside a raw one; none for an answer of another type (an error). A contextual calibration has no id. */
export function calibratedAnswer(spec: QuestionSpec, answer: Answer, calibration: { id: string; parameters: CalibrationParams }): CalibratedAnswer | undefined {
  const raw = labelDistribution(spec, answer);
  if (!raw) return undefined;
  const calibrated = applyCalibration(calibration.parameters, raw);
  const head = { calibrationId: calibration.id, method: calibration.parameters.method };
  switch (spec.type) {
    case "noul":
      return create(CalibratedAnswerSchema, { ...head, noul: round6(calibrated[0]!) });
    case "choice":
      return create(CalibratedAnswerSchema, {
        ...head,
        choice: spec.options[argmax(calibrated)],
        probabilities: Object.fromEntries(spec.options.map((name, i) => [name, round6(calibrated[i]!)])),
      });
    case "score":
      return create(CalibratedAnswerSchema, {
        ...head,
        score: round6(expectedLevel(calibrated)),
        probabilities: Object.fromEntries(spec.labels.map((_, i) => [String(i), round6(calibrated[i]!)])),
      });
  }
}
