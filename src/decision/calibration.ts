import { create } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import type { Knex } from "knex";
import { apiError } from "../errors.js";
import { applyCalibration, type CalibrationParams } from "../evaluation/calibration-apply.js";
import { contextualParams } from "../evaluation/calibration-fit.js";
import { signatureMismatch, signatureOf } from "../evaluation/calibration-signature.js";
import { findCalibrations, type DbCalibrationRow } from "../evaluation/calibration-store.js";
import { CalibratedAnswerSchema, type Answer, type CalibratedAnswer } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { pathOf } from "../validation.js";
import { argmax, expectedLevel, round6 } from "./answer-math.js";
import type { CallOptions } from "../upstream/model-call.js";
import type { DecisionEngine, QuestionSpec, UsageTotals } from "./engine.js";
import { renderState } from "./prompt.js";

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
  /**
   * The account of an API key (by its hash) that named a calibration before:
   * a key never moves to another account, so this is never stale, and the
   * call's admission still checks that the key is live.
   */
  accountOfKey(keyHash: string): string | undefined;
  putKey(keyHash: string, accountId: string): void;
}

/** Keys whose account is kept per process, for the calibration's ownership check. */
export const MAX_CACHED_KEYS = 10_000;

export function createCalibrationCache(maxEntries = MAX_CACHED_CALIBRATIONS): CalibrationCache {
  const rows = boundedMap<DbCalibrationRow>(maxEntries);
  const keys = boundedMap<string>(MAX_CACHED_KEYS);
  return { get: (id) => rows.get(id), put: (row) => rows.set(row.id, row), accountOfKey: (hash) => keys.get(hash), putKey: (hash, accountId) => keys.set(hash, accountId) };
}

/**
 * The states of a contextual calibration's probe: they carry nothing that
 * favours any label. Zhao et al. (2021) average the label probabilities of
 * several such inputs ("N/A", "[MASK]" and the empty string); the mask token
 * means nothing to a chat model, so we ask the other two. A caller may not
 * send an empty state (validation refuses it); the probe is asked here, inside
 * the service, and never passes through a caller's validation.
 */
export const CONTENT_FREE_STATES: readonly string[] = ["N/A", ""];
/** The value of Question.calibration that asks for contextual calibration. */
export const CONTEXTUAL = "contextual";

/**
 * The answers to the content-free state, by question signature digest,
 * bounded: each signature is probed once per process while it stays in the
 * map, and by one call at a time. A probe depends only on the signature,
 * which names the prompt version and the upstream model, so a kept one never
 * goes stale.
 */
export interface ProbeCache {
  get(digest: string): number[] | undefined;
  /**
   * The probe of `digest` for a call that needs it: the kept one; else the
   * one another call of this process is asking now, which this call waits for
   * and pays nothing for; else this call asks it with `ask` and pays for it
   * (`usage`). When the call waited for ends without a probe (its upstream
   * failed, or its caller left), this call asks itself, so it never depends
   * on another caller's fate. A wait ends at this call's own deadline (no
   * probe, as when it got no answer: on the embedded model each call plans
   * its own, which may come before the asker's) or when its signal aborts (a
   * rejection with the signal's reason).
   */
  probe(digest: string, ask: () => Promise<ContentFreeProbe>, options: CallOptions): Promise<{ probe: number[] | undefined; usage?: UsageTotals }>;
}

export function createProbeCache(maxEntries = MAX_CACHED_CALIBRATIONS): ProbeCache {
  const probes = boundedMap<number[]>(maxEntries);
  /** The probes being asked, each settling (never rejecting) once its asker is done and it is kept or not. */
  const asking = new Map<string, Promise<number[] | undefined>>();
  return {
    get: (digest) => probes.get(digest),
    async probe(digest, ask, options) {
      for (;;) {
        const kept = probes.get(digest);
        if (kept) return { probe: kept };
        const theirs = asking.get(digest);
        if (!theirs) break;
        // Theirs leaves the map before it settles, so a probe that failed for them is asked next, not waited for again.
        const probe = await untilDeadline(theirs, options);
        if (probe === TOO_LATE) return { probe: undefined };
        if (probe) return { probe };
      }
      const mine = ask();
      const done = mine
        .then(
          ({ probe }) => probe,
          () => undefined,
        )
        .then((probe) => {
          if (probe) probes.set(digest, probe);
          asking.delete(digest);
          return probe;
        });
      asking.set(digest, done);
      return mine;
    },
  };
}

const TOO_LATE = Symbol("past the deadline");

/** `promise`'s value; TOO_LATE once `deadlineMs` passes first; a rejection with its reason once `signal` aborts first. */
function untilDeadline<T>(promise: Promise<T>, { signal, deadlineMs }: CallOptions): Promise<T | typeof TOO_LATE> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => settle(() => resolve(TOO_LATE)), Math.max(0, deadlineMs - Date.now()));
    const onAbort = () => settle(() => reject(signal.reason));
    const settle = (then: () => void) => {
      clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
      then();
    };
    signal.addEventListener("abort", onAbort, { once: true });
    void promise.then((value) => settle(() => resolve(value)));
  });
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

/** The content-free probe of one question: the mean of its label distributions over CONTENT_FREE_STATES, and what asking cost. */
export interface ContentFreeProbe {
  /** Undefined unless every content-free state was answered: a probe of one state is not the average the method uses. */
  probe: number[] | undefined;
  usage: UsageTotals;
}

/**
 * Asks `spec` about each content-free state, in parallel, and averages the
 * label distributions as a contextual fit does (contextualParams). One engine
 * call per state, so the usage is this question's own.
 */
export async function askContentFree(engine: DecisionEngine, spec: QuestionSpec, options: CallOptions): Promise<ContentFreeProbe> {
  const outcomes = await Promise.all(
    CONTENT_FREE_STATES.map((text) => engine.decide({ stateBlock: renderState(create(ValueSchema, { kind: { case: "stringValue", value: text } })), questions: [spec] }, options)),
  );
  const usage = { inputTokens: 0, outputTokens: 0, cachedInputTokens: 0, upstreamCalls: 0 };
  for (const outcome of outcomes) addUsage(usage, outcome.usage);
  const distributions = outcomes.map((outcome) => labelDistribution(spec, outcome.answers[0]![1]));
  if (distributions.some((d) => d === undefined)) return { probe: undefined, usage };
  const probes = distributions as number[][];
  return { probe: contextualParams(probes, probes[0]!.length).probe, usage };
}

/** Adds `more` into `total`, field by field. */
export function addUsage(total: UsageTotals, more: UsageTotals): void {
  for (const key of ["inputTokens", "outputTokens", "cachedInputTokens", "upstreamCalls"] as const) total[key] += more[key];
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

/**
 * The calibrated answer beside a raw one; none for an answer of another type
 * (an error). A contextual calibration has no id; `probeUsage` is what its
 * probe cost when this call asked it.
 */
export function calibratedAnswer(
  spec: QuestionSpec,
  answer: Answer,
  calibration: { id: string; parameters: CalibrationParams },
  probeUsage?: UsageTotals,
): CalibratedAnswer | undefined {
  const raw = labelDistribution(spec, answer);
  if (!raw) return undefined;
  const calibrated = applyCalibration(calibration.parameters, raw);
  // Each init written out whole: spreading a shared head costs more than the rest of the apply.
  const calibrationId = calibration.id;
  const method = calibration.parameters.method;
  switch (spec.type) {
    case "noul":
      return create(CalibratedAnswerSchema, { calibrationId, method, probeUsage, noul: round6(calibrated[0]!) });
    case "choice":
      return create(CalibratedAnswerSchema, {
        calibrationId,
        method,
        probeUsage,
        choice: spec.options[argmax(calibrated)],
        probabilities: Object.fromEntries(spec.options.map((name, i) => [name, round6(calibrated[i]!)])),
      });
    case "score":
      return create(CalibratedAnswerSchema, {
        calibrationId,
        method,
        probeUsage,
        score: round6(expectedLevel(calibrated)),
        probabilities: Object.fromEntries(spec.labels.map((_, i) => [String(i), round6(calibrated[i]!)])),
      });
  }
}
