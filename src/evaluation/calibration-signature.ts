import { hash } from "node:crypto";
import type { QuestionSpec } from "../decision/engine.js";
import type { CalibrationSignature } from "./calibration-store.js";

/** The signature of a question as the service asks it now: a calibration fits only answers read this way. */
export function signatureOf(spec: QuestionSpec, asked: { promptVersion: string; model: string; upstream: string }): CalibrationSignature {
  return {
    type: spec.type,
    instructions: spec.instructions,
    labels: spec.type === "choice" ? [...spec.options] : spec.type === "score" ? [...spec.labels] : [],
    promptVersion: asked.promptVersion,
    model: asked.model,
    upstream: asked.upstream,
  };
}

/** sha256 of the signature's canonical JSON (fixed key order): equal signatures, equal digests. */
export function signatureDigest(s: CalibrationSignature): string {
  const canonical = JSON.stringify([s.type, s.instructions, s.labels, s.promptVersion, s.model, s.upstream]);
  return hash("sha256", canonical, "hex");
}

/** The first part in which a question differs from a calibration's signature, or undefined when they match. */
export function signatureMismatch(calibration: CalibrationSignature, question: CalibrationSignature): string | undefined {
  if (calibration.type !== question.type) return `type (the calibration is for ${calibration.type})`;
  if (calibration.instructions !== question.instructions) return "instructions";
  if (calibration.labels.length !== question.labels.length || calibration.labels.some((label, i) => label !== question.labels[i])) {
    return calibration.type === "choice" ? "options" : "labels";
  }
  if (calibration.promptVersion !== question.promptVersion) return `prompt version (the calibration is for ${calibration.promptVersion})`;
  if (calibration.model !== question.model) return "model";
  if (calibration.upstream !== question.upstream) return "upstream model";
  return undefined;
}
