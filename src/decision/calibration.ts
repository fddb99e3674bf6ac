import { create } from "@bufbuild/protobuf";
import type { Knex } from "knex";
import { apiError } from "../errors.js";
import { applyCalibration } from "../evaluation/calibration-apply.js";
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
  const rows = new Map<string, DbCalibrationRow>();
  return {
    get: (id) => rows.get(id),
    put(row) {
      rows.delete(row.id);
      rows.set(row.id, row);
      if (rows.size > maxEntries) rows.delete(rows.keys().next().value!);
    },
  };
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

/** The calibrated answer beside a raw one; none for an answer of another type (an error). */
export function calibratedAnswer(spec: QuestionSpec, answer: Answer, row: DbCalibrationRow): CalibratedAnswer | undefined {
  if (answer.type !== spec.type) return undefined;
  const head = { calibrationId: row.id, method: row.method };
  switch (spec.type) {
    case "noul": {
      const p = answer.noul ?? 0;
      return create(CalibratedAnswerSchema, { ...head, noul: round6(applyCalibration(row.parameters, [p, 1 - p])[0]!) });
    }
    case "choice": {
      const calibrated = applyCalibration(row.parameters, spec.options.map((name) => answer.probabilities[name] ?? 0));
      return create(CalibratedAnswerSchema, {
        ...head,
        choice: spec.options[argmax(calibrated)],
        probabilities: Object.fromEntries(spec.options.map((name, i) => [name, round6(calibrated[i]!)])),
      });
    }
    case "score": {
      const calibrated = applyCalibration(row.parameters, spec.labels.map((_, i) => answer.probabilities[String(i)] ?? 0));
      return create(CalibratedAnswerSchema, {
        ...head,
        score: round6(expectedLevel(calibrated)),
        probabilities: Object.fromEntries(spec.labels.map((_, i) => [String(i), round6(calibrated[i]!)])),
      });
    }
  }
}
