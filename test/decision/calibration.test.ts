import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { calibratedAnswer, createCalibrationCache } from "../../src/decision/calibration.js";
import type { QuestionSpec } from "../../src/decision/engine.js";
import type { CalibrationParams } from "../../src/evaluation/calibration-apply.js";
import type { DbCalibrationRow } from "../../src/evaluation/calibration-store.js";
import { AnswerSchema } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";

/** A stored calibration with these parameters; only id, method and parameters matter to the apply. */
function row(parameters: CalibrationParams, id = "c1"): DbCalibrationRow {
  return {
    id,
    account_id: "a",
    evaluation_id: "e",
    question_key: "q",
    method: parameters.method,
    question_type: "choice",
    instructions: "",
    labels: [],
    prompt_version: "p1",
    model: "m",
    upstream: "u",
    signature: "s",
    version: 1,
    parameters,
    held_out: { folds: 5, seed: 1, before: { count: 0, ece: null, brier: null, logLoss: null, accuracy: null }, after: { count: 0, ece: null, brier: null, logLoss: null, accuracy: null } },
    created_by: "x",
    created_at: new Date(0),
  };
}

const softmax = (v: number[]) => {
  const e = v.map((x) => Math.exp(x - Math.max(...v)));
  const s = e.reduce((a, b) => a + b, 0);
  return e.map((x) => x / s);
};

describe("calibratedAnswer", () => {
  it.each([
    // Temperature 2 on (0.7, 0.2, 0.1): softmax(log p / 2) ∝ √p = (0.83666, 0.44721, 0.31623), summing to 1.60010.
    ["choice, temperature 2", { method: "temperature", temperature: 2 } as CalibrationParams, [0.7, 0.2, 0.1], [0.522880, 0.279490, 0.197630]],
    // A bias of +2 on the last option turns it into the most probable one.
    ["choice, vector", { method: "vector", temperature: 1, biases: [0, 0, 2] } as CalibrationParams, [0.5, 0.3, 0.2], softmax([Math.log(0.5), Math.log(0.3), Math.log(0.2) + 2])],
  ])("%s: the probabilities in the options' order, the choice their argmax", (_name, params, raw, expected) => {
    const spec: QuestionSpec = { key: "q", type: "choice", instructions: "?", options: ["a", "b", "c"] };
    const answer = create(AnswerSchema, { type: "choice", choice: "a", probabilities: { a: raw[0]!, b: raw[1]!, c: raw[2]! } });
    const calibrated = calibratedAnswer(spec, answer, row(params))!;
    expect(Object.keys(calibrated.probabilities)).toEqual(["a", "b", "c"]);
    expected.forEach((p, i) => expect(calibrated.probabilities["abc"[i]!]).toBeCloseTo(p, 5));
    expect(calibrated.choice).toBe("abc"[expected.indexOf(Math.max(...expected))]);
    expect([calibrated.calibrationId, calibrated.method]).toEqual(["c1", params.method]);
  });

  it("score: levels keyed as the raw answer, and the expected level of the calibrated distribution", () => {
    const spec: QuestionSpec = { key: "q", type: "score", instructions: "?", labels: ["low", "high"] };
    const answer = create(AnswerSchema, { type: "score", score: 0.8, probabilities: { "0": 0.2, "1": 0.8 } });
    // Temperature 1/2 squares the ratio: 0.8² : 0.2² = 0.64 : 0.04, so P(1) = 0.941176.
    const calibrated = calibratedAnswer(spec, answer, row({ method: "temperature", temperature: 0.5 }))!;
    expect(calibrated.probabilities).toEqual({ "0": 0.058824, "1": 0.941176 });
    expect(calibrated.score).toBe(0.941176);
  });

  it("noul: Platt on the log-odds of [p, 1 − p]", () => {
    const spec: QuestionSpec = { key: "q", type: "noul", instructions: "?" };
    // slope 1/3, intercept 0: logit(0.8) = 1.386294 → σ(0.462098) = 0.613512.
    const calibrated = calibratedAnswer(spec, create(AnswerSchema, { type: "noul", noul: 0.8 }), row({ method: "platt", slope: 1 / 3, intercept: 0 }))!;
    expect(calibrated.noul).toBe(0.613512);
    expect(calibrated.probabilities).toEqual({});
  });

  it("an error answer gets no calibrated answer", () => {
    const spec: QuestionSpec = { key: "q", type: "noul", instructions: "?" };
    expect(calibratedAnswer(spec, create(AnswerSchema, { type: "error", code: "timeout" }), row({ method: "platt", slope: 1, intercept: 0 }))).toBeUndefined();
  });
});

describe("createCalibrationCache", () => {
  it("keeps at most its bound, the oldest leaving first", () => {
    const cache = createCalibrationCache(2);
    for (const id of ["a", "b", "c"]) cache.put(row({ method: "temperature", temperature: 1 }, id));
    expect([cache.get("a"), cache.get("b")?.id, cache.get("c")?.id]).toEqual([undefined, "b", "c"]);
  });
});
