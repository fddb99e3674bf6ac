import { describe, expect, it } from "vitest";
import { applyCalibration, interpolate, logOdds, LOGIT_EPS, sigmoid, softmax, type CalibrationParams } from "../../src/evaluation/calibration-apply.js";
import {
  contextualParams,
  fitCalibration,
  fitIsotonic,
  fitPlatt,
  fitTemperature,
  fitVectorScaling,
  foldOf,
  MIN_CALIBRATION_EXAMPLES,
  solveLinear,
} from "../../src/evaluation/calibration-fit.js";
import { choiceMetrics } from "../../src/evaluation/metrics.js";
import { seededPermutation, seededRandom } from "../../src/evaluation/seeded-random.js";

const close = (values: readonly number[], expected: readonly number[], digits = 12) => {
  expect(values).toHaveLength(expected.length);
  values.forEach((v, i) => expect(v).toBeCloseTo(expected[i]!, digits));
};

describe("applyCalibration, by hand", () => {
  it.each<{ name: string; params: CalibrationParams; raw: number[]; expected: number[] }>([
    // logit(0.75) = ln 3; σ(2 ln 3 + 0.5) = 1 / (1 + e^−0.5 / 9).
    { name: "platt", params: { method: "platt", slope: 2, intercept: 0.5 }, raw: [0.75, 0.25], expected: [1 / (1 + Math.exp(-0.5) / 9), 1 - 1 / (1 + Math.exp(-0.5) / 9)] },
    { name: "platt, identity", params: { method: "platt", slope: 1, intercept: 0 }, raw: [0.3, 0.7], expected: [0.3, 0.7] },
    { name: "platt, a certain answer stays finite", params: { method: "platt", slope: 0.5, intercept: 0 }, raw: [1, 0], expected: [1 / (1 + LOGIT_EPS ** 0.5), LOGIT_EPS ** 0.5 / (1 + LOGIT_EPS ** 0.5)] },
    { name: "isotonic, between points", params: { method: "isotonic", x: [0.2, 0.5, 0.8], y: [0.1, 0.4, 0.9] }, raw: [0.35, 0.65], expected: [0.25, 0.75] },
    { name: "isotonic, on a point", params: { method: "isotonic", x: [0.2, 0.5, 0.8], y: [0.1, 0.4, 0.9] }, raw: [0.5, 0.5], expected: [0.4, 0.6] },
    { name: "isotonic, upper half", params: { method: "isotonic", x: [0.2, 0.5, 0.8], y: [0.1, 0.4, 0.9] }, raw: [0.65, 0.35], expected: [0.65, 0.35] },
    { name: "isotonic, clipped below", params: { method: "isotonic", x: [0.2, 0.5, 0.8], y: [0.1, 0.4, 0.9] }, raw: [0.1, 0.9], expected: [0.1, 0.9] },
    { name: "isotonic, clipped above", params: { method: "isotonic", x: [0.2, 0.5, 0.8], y: [0.1, 0.4, 0.9] }, raw: [0.95, 0.05], expected: [0.9, 0.1] },
    { name: "isotonic, one point", params: { method: "isotonic", x: [0.4], y: [0.7] }, raw: [0.9, 0.1], expected: [0.7, 0.3] },
    // softmax(log p / 2) is √p renormalised: √0.64 = 0.8, √0.36 = 0.6.
    { name: "temperature 2", params: { method: "temperature", temperature: 2 }, raw: [0.64, 0.36], expected: [0.8 / 1.4, 0.6 / 1.4] },
    { name: "temperature 1/2 squares", params: { method: "temperature", temperature: 0.5 }, raw: [0.25, 0.75], expected: [1 / 10, 9 / 10] },
    { name: "vector: a bias of ln 2", params: { method: "vector", temperature: 1, biases: [Math.log(2), 0, 0] }, raw: [1 / 3, 1 / 3, 1 / 3], expected: [0.5, 0.25, 0.25] },
    { name: "vector: temperature and bias", params: { method: "vector", temperature: 2, biases: [0, Math.log(3)] }, raw: [0.64, 0.36], expected: [0.8 / 2.6, 1.8 / 2.6] },
    { name: "contextual: the probe itself becomes uniform", params: { method: "contextual", probe: [0.8, 0.2] }, raw: [0.8, 0.2], expected: [0.5, 0.5] },
    { name: "contextual: divide and renormalise", params: { method: "contextual", probe: [0.8, 0.2] }, raw: [0.5, 0.5], expected: [0.2, 0.8] },
    { name: "contextual: three labels", params: { method: "contextual", probe: [0.5, 0.25, 0.25] }, raw: [0.5, 0.3, 0.2], expected: [1 / 3, 1.2 / 3, 0.8 / 3] },
    { name: "contextual: no label seen stays zeros", params: { method: "contextual", probe: [0.5, 0.5] }, raw: [0, 0], expected: [0, 0] },
    { name: "contextual: a zero in the probe is floored", params: { method: "contextual", probe: [1, 0] }, raw: [0.5, 0.5], expected: [LOGIT_EPS / (1 + LOGIT_EPS), 1 / (1 + LOGIT_EPS)] },
  ])("$name", ({ params, raw, expected }) => {
    close(applyCalibration(params, raw), expected);
  });

  it("the helpers", () => {
    expect(logOdds([0.75, 0.25])).toBeCloseTo(Math.log(3), 12);
    expect(logOdds([0, 1])).toBeCloseTo(Math.log(LOGIT_EPS), 9);
    expect(sigmoid(-800)).toBe(0);
    expect(sigmoid(800)).toBe(1);
    expect(sigmoid(Math.log(3))).toBeCloseTo(0.75, 12);
    expect(sigmoid(-Math.log(3))).toBeCloseTo(0.25, 12);
    close(softmax([1000, 1000 + Math.log(3)]), [0.25, 0.75]);
    close(softmax([0, 800]), [0, 1]);
    close(softmax([-800, 0]), [0, 1]);
    expect(interpolate([0, 1], [0, 1], Number.NaN)).toBe(0);
  });
});

describe("fitIsotonic: pool-adjacent-violators", () => {
  it.each([
    { name: "already increasing", x: [0.1, 0.2, 0.3], y: [0, 0, 1], fx: [0.1, 0.2, 0.3], fy: [0, 0, 1] },
    { name: "one violation pools two points", x: [0.1, 0.2, 0.3, 0.4], y: [0, 1, 0, 1], fx: [0.1, 0.2, 0.3, 0.4], fy: [0, 0.5, 0.5, 1] },
    // [1], [0] pool to 1/2; a further 0 pools to 1/3, another to 1/4; the middle of the flat run is dropped.
    { name: "a cascade, flat middle dropped", x: [0.1, 0.2, 0.3, 0.4, 0.5], y: [1, 0, 0, 0, 1], fx: [0.1, 0.4, 0.5], fy: [0.25, 0.25, 1] },
    { name: "input order does not matter", x: [0.5, 0.3, 0.1, 0.4, 0.2], y: [1, 0, 1, 0, 0], fx: [0.1, 0.4, 0.5], fy: [0.25, 0.25, 1] },
    { name: "equal x values are merged first", x: [0.3, 0.6, 0.3], y: [0, 1, 1], fx: [0.3, 0.6], fy: [0.5, 1] },
    { name: "x values within 1e-15 are one", x: [0.1, 0.1 + 1e-16, 0.2], y: [1, 0, 1], fx: [0.1, 0.2], fy: [0.5, 1] },
    { name: "all decreasing: one block", x: [0.1, 0.2, 0.3], y: [1, 1, 0], fx: [0.1, 0.3], fy: [2 / 3, 2 / 3] },
    { name: "a single point", x: [0.4], y: [1], fx: [0.4], fy: [1] },
  ])("$name", ({ x, y, fx, fy }) => {
    const fit = fitIsotonic(x, y);
    close(fit.x, fx);
    close(fit.y, fy);
  });
});

describe("fitPlatt", () => {
  // At the optimum of the smoothed-target log loss both partial derivatives vanish.
  it.each([
    { name: "overlapping classes", x: [-2, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, -3], y: [false, false, true, false, true, true, false, true, true, false] },
    { name: "separable classes stay finite (the smoothed targets)", x: [-2, -1, 1, 2], y: [false, false, true, true] },
    { name: "large log-odds", x: [-30, -25, 20, 27, 5, -4], y: [false, true, true, true, false, false] },
  ])("the gradient vanishes: $name", ({ x, y }) => {
    const { slope, intercept } = fitPlatt(x, y);
    const positives = y.filter(Boolean).length;
    const negatives = y.length - positives;
    let gSlope = 0;
    let gIntercept = 0;
    x.forEach((xi, i) => {
      const t = y[i] ? (positives + 1) / (positives + 2) : 1 / (negatives + 2);
      const d = sigmoid(slope * xi + intercept) - t;
      gSlope += d * xi;
      gIntercept += d;
    });
    expect(Math.abs(gSlope)).toBeLessThan(1e-8);
    expect(Math.abs(gIntercept)).toBeLessThan(1e-8);
    expect(Number.isFinite(slope) && Number.isFinite(intercept)).toBe(true);
  });

  it("one class only: the intercept is the smoothed prior and the slope zero", () => {
    // Targets all 3/4 (N₊ = 2) with equal x: σ(b) = 3/4.
    const fit = fitPlatt([1, 1], [true, true]);
    expect(fit.intercept + fit.slope).toBeCloseTo(Math.log(3), 6);
  });

  it("balanced, symmetric data: the intercept is zero", () => {
    const fit = fitPlatt([-2, -1, 1, 2, -1, 1], [false, true, true, true, false, false]);
    expect(fit.intercept).toBeCloseTo(0, 9);
    expect(fit.slope).toBeGreaterThan(0);
  });
});

describe("fitTemperature and fitVectorScaling", () => {
  it("the temperature's first-order condition holds", () => {
    const points = [
      { probabilities: [0.7, 0.2, 0.1], label: 0 },
      { probabilities: [0.6, 0.3, 0.1], label: 1 },
      { probabilities: [0.2, 0.2, 0.6], label: 2 },
      { probabilities: [0.8, 0.1, 0.1], label: 2 },
    ];
    const { temperature } = fitTemperature(points);
    const beta = 1 / temperature;
    let slope = 0;
    points.forEach(({ probabilities, label }) => {
      const z = probabilities.map(Math.log);
      const q = softmax(z.map((v) => beta * v));
      slope += z.reduce((a, v, k) => a + q[k]! * v, 0) - z[label]!;
    });
    expect(Math.abs(slope)).toBeLessThan(1e-9);
    expect(temperature).toBeGreaterThan(1);
  });

  it.each([
    // Always right and confident: the sharper the better, up to the bound e^10 on 1/T.
    { name: "always right", points: [{ probabilities: [0.6, 0.4], label: 0 }, { probabilities: [0.3, 0.7], label: 1 }], temperature: Math.exp(-10) },
    // Always wrong: the flatter the better, down to T = e^10.
    { name: "always wrong", points: [{ probabilities: [0.6, 0.4], label: 1 }, { probabilities: [0.3, 0.7], label: 0 }], temperature: Math.exp(10) },
  ])("a temperature at its bound: $name", ({ points, temperature }) => {
    expect(fitTemperature(points)).toEqual({ method: "temperature", temperature: expect.closeTo(temperature, 9) });
  });

  it("vector scaling: the gradient with the bias prior vanishes and the biases sum to zero", () => {
    const points = [
      { probabilities: [0.7, 0.2, 0.1], label: 0 },
      { probabilities: [0.6, 0.3, 0.1], label: 1 },
      { probabilities: [0.2, 0.2, 0.6], label: 2 },
      { probabilities: [0.8, 0.1, 0.1], label: 1 },
      { probabilities: [0.3, 0.4, 0.3], label: 1 },
    ];
    const { temperature, biases } = fitVectorScaling(points, 3);
    const beta = 1 / temperature;
    const gradient = [0, 0, 0, 0];
    points.forEach(({ probabilities, label }) => {
      const z = probabilities.map(Math.log);
      const q = softmax(z.map((v, k) => beta * v + biases[k]!));
      gradient[0]! += z.reduce((a, v, k) => a + q[k]! * v, 0) - z[label]!;
      q.forEach((qk, k) => (gradient[k + 1]! += qk - (k === label ? 1 : 0)));
    });
    biases.forEach((b, k) => (gradient[k + 1]! += b));
    gradient.forEach((g) => expect(Math.abs(g)).toBeLessThan(1e-7));
    expect(biases.reduce((a, b) => a + b, 0)).toBeCloseTo(0, 9);
    expect(biases[1]).toBeGreaterThan(biases[0]!);
  });
});

describe("contextualParams", () => {
  it.each([
    { name: "one probe", probes: [[0.8, 0.2]], probe: [0.8, 0.2] },
    { name: "probes are averaged", probes: [[0.6, 0.4], [0.8, 0.2]], probe: [0.7, 0.3] },
    { name: "each probe is normalised first", probes: [[3, 1], [0.5, 0.5]], probe: [0.625, 0.375] },
    { name: "a label the probe never gave", probes: [[1, 0]], probe: [1, 0] },
  ])("$name", ({ probes, probe }) => {
    close(contextualParams(probes, 2).probe, probe);
  });

  it.each([
    { name: "no probe", probes: [], message: "probes: expected at least one" },
    { name: "wrong length", probes: [[0.5, 0.5], [1]], message: "probes[1]: expected 2" },
    { name: "no label in the probe", probes: [[0, 0]], message: "probes[0]: no label" },
  ])("refuses $name", ({ probes, message }) => {
    expect(() => contextualParams(probes, 2)).toThrow(message);
  });
});

describe("solveLinear", () => {
  it.each([
    { name: "diagonal", matrix: [[2, 0], [0, 4]], rhs: [2, 8], x: [1, 2] },
    // 4x + y = 9, x + 3y = 5: x = 2, y = 1.
    { name: "symmetric 2 × 2", matrix: [[4, 1], [1, 3]], rhs: [9, 5], x: [2, 1] },
    // The solution (1, −2, 3) of a symmetric positive definite system.
    { name: "symmetric 3 × 3", matrix: [[4, 1, 2], [1, 5, 1], [2, 1, 6]], rhs: [8, -6, 18], x: [1, -2, 3] },
  ])("$name", ({ matrix, rhs, x }) => {
    close(solveLinear(matrix, rhs), x);
  });
});

describe("seededRandom", () => {
  it("is mulberry32: the reference implementation's first draws for seed 1, and a fixed permutation", () => {
    // Computed with mulberry32's published C/JavaScript form; stored fits name their seed, so these must never change.
    const random = seededRandom(1);
    expect([random(), random(), random()]).toEqual([0.6270739405881613, 0.002735721180215478, 0.5274470399599522]);
    expect(seededPermutation(10, 1)).toEqual([7, 8, 3, 2, 1, 5, 9, 4, 0, 6]);
    expect(seededPermutation(1, 1)).toEqual([0]);
  });
});

describe("folds and fitCalibration", () => {
  it("folds are balanced, seeded and a permutation's deal", () => {
    const fold = foldOf(23, 5, 7);
    const sizes = [0, 1, 2, 3, 4].map((f) => fold.filter((x) => x === f).length);
    expect(sizes.sort()).toEqual([4, 4, 5, 5, 5]);
    expect(foldOf(23, 5, 7)).toEqual(fold);
    expect(foldOf(23, 5, 8)).not.toEqual(fold);
    const order = seededPermutation(23, 7);
    expect([...order].sort((a, b) => a - b)).toEqual(Array.from({ length: 23 }, (_, i) => i));
    order.forEach((index, position) => expect(fold[index]).toBe(position % 5));
    const random = seededRandom(3);
    const draws = [random(), random(), random()];
    expect(new Set(draws).size).toBe(3);
    draws.forEach((d) => expect(d >= 0 && d < 1).toBe(true));
  });

  const noulPoints = Array.from({ length: 40 }, (_, i) => ({ probabilityTrue: (i + 0.5) / 40, label: i % 3 !== 0 }));

  it("returns the fit on all points and the cross-fitted metrics before and after", () => {
    const fit = fitCalibration({ type: "noul", method: "platt", points: noulPoints });
    expect(fit.params).toEqual(fitPlatt(noulPoints.map((p) => logOdds([p.probabilityTrue, 1 - p.probabilityTrue])), noulPoints.map((p) => p.label)));
    expect(fit.heldOut.folds).toBe(5);
    expect(fit.heldOut.seed).toBe(1);
    expect(fit.heldOut.before.count).toBe(40);
    expect(fit.heldOut.after.count).toBe(40);
    // Labels are two-thirds true whatever p says: the raw answers are badly calibrated, the fitted ones far less.
    expect(fit.heldOut.before.brier).toBeCloseTo(noulPoints.reduce((s, p) => s + (p.probabilityTrue - (p.label ? 1 : 0)) ** 2, 0) / 40, 12);
    expect(fit.heldOut.after.brier!).toBeLessThan(fit.heldOut.before.brier!);
    expect(fit.heldOut.after.ece!).toBeLessThan(fit.heldOut.before.ece!);
  });

  it("each held-out answer is calibrated by a fit that never saw it", () => {
    const fit = fitCalibration({ type: "noul", method: "isotonic", points: noulPoints, folds: 4, seed: 9 });
    const fold = foldOf(40, 4, 9);
    let brier = 0;
    noulPoints.forEach((point, i) => {
      const rest = noulPoints.filter((_, j) => fold[j] !== fold[i]);
      const params = fitIsotonic(rest.map((p) => p.probabilityTrue), rest.map((p) => (p.label ? 1 : 0)));
      brier += (applyCalibration(params, [point.probabilityTrue, 1 - point.probabilityTrue])[0]! - (point.label ? 1 : 0)) ** 2;
    });
    expect(fit.heldOut.after.brier).toBeCloseTo(brier / 40, 12);
    expect(fit.heldOut.folds).toBe(4);
  });

  it("choice: temperature and vector fits, the summary on the top label", () => {
    const points = Array.from({ length: 30 }, (_, i) => ({ probabilities: i % 2 ? [0.9, 0.05, 0.05] : [0.05, 0.05, 0.9], label: i % 5 === 0 ? 1 : i % 2 ? 0 : 2 }));
    const temperature = fitCalibration({ type: "choice", method: "temperature", points, labelCount: 3 });
    expect(temperature.params).toEqual(fitTemperature(points));
    expect(temperature.heldOut.before.accuracy).toBeCloseTo(24 / 30, 12);
    expect(temperature.heldOut.before.ece).toBeCloseTo(Math.abs(0.9 - 24 / 30), 12);
    const vector = fitCalibration({ type: "score", method: "vector", points, labelCount: 3 });
    expect(vector.params).toEqual(fitVectorScaling(points, 3));
    expect(vector.heldOut.after.logLoss!).toBeLessThan(vector.heldOut.before.logLoss!);
  });

  it("a two-option choice is measured on its top label, as its evaluation is", () => {
    const points = Array.from({ length: 24 }, (_, i) => ({ probabilities: i % 3 ? [0.2, 0.8] : [0.7, 0.3], label: i % 4 === 0 ? 0 : 1 }));
    const fit = fitCalibration({ type: "choice", method: "temperature", points, labelCount: 2 });
    const m = choiceMetrics(points, ["a", "b"]);
    expect(fit.heldOut.before).toEqual({ count: 24, ece: m.topLabelEce, brier: m.brier, logLoss: m.logLoss, accuracy: m.accuracy });
  });

  it("contextual needs no labels: the measure is on every labelled point", () => {
    const fit = fitCalibration({
      type: "choice",
      method: "contextual",
      probes: [[0.5, 0.25, 0.25]],
      points: [
        { probabilities: [0.5, 0.3, 0.2], label: 1 },
        { probabilities: [0.6, 0.2, 0.2], label: 0 },
      ],
      labelCount: 3,
    });
    expect(fit.params).toEqual({ method: "contextual", probe: [0.5, 0.25, 0.25] });
    expect(fit.heldOut).toMatchObject({ folds: 1, before: { count: 2, accuracy: 0.5 }, after: { count: 2, accuracy: 1 } });
    // After: [1, 1.2, 0.8]/3 (label 1, now right) and [1.2, 0.8, 0.8]/2.8 (label 0, right); before, the first was wrong.
    expect(fit.heldOut.after.logLoss).toBeCloseTo(-(Math.log(1.2 / 3) + Math.log(1.2 / 2.8)) / 2, 12);
    const noulFit = fitCalibration({ type: "noul", method: "contextual", probes: [[0.8, 0.2]], points: [{ probabilityTrue: 0.8, label: false }], labelCount: 2 });
    expect(noulFit.heldOut.after.brier).toBeCloseTo(0.25, 12);
  });

  it.each([
    { name: "too few points", request: { type: "noul" as const, method: "platt" as const, points: noulPoints.slice(0, MIN_CALIBRATION_EXAMPLES - 1) }, message: "points: a fit needs at least 20" },
    { name: "more folds than points", request: { type: "noul" as const, method: "platt" as const, points: noulPoints.slice(0, 25), folds: 30 }, message: "points: a fit needs at least 30" },
    { name: "one fold", request: { type: "noul" as const, method: "platt" as const, points: noulPoints, folds: 1 }, message: "folds: expected an integer of at least 2" },
    { name: "a fractional fold count", request: { type: "noul" as const, method: "platt" as const, points: noulPoints, folds: 2.5 }, message: "folds: expected an integer of at least 2" },
    {
      name: "a probability above 1",
      request: { type: "noul" as const, method: "isotonic" as const, points: noulPoints.map((p, i) => (i === 7 ? { ...p, probabilityTrue: 1.5 } : p)) },
      message: "points[7].probabilityTrue",
    },
  ])("refuses $name", ({ request, message }) => {
    expect(() => fitCalibration(request)).toThrow(message);
  });

  it.each([
    { name: "a label out of range", point: { probabilities: [0.5, 0.5], label: 2 }, message: "points[20].label" },
    { name: "too few probabilities", point: { probabilities: [1], label: 0 }, message: "points[20].probabilities: expected 2" },
  ])("refuses a distribution with $name, before any fit", ({ point, message }) => {
    const points = [...Array.from({ length: 20 }, (_, i) => ({ probabilities: [0.6, 0.4], label: i % 2 })), point];
    expect(() => fitCalibration({ type: "choice", method: "temperature", points, labelCount: 2 })).toThrow(message);
    expect(() => fitCalibration({ type: "choice", method: "contextual", probes: [[0.5, 0.5]], points, labelCount: 2 })).toThrow(message);
  });

  it("refuses a contextual noul point that is no probability", () => {
    expect(() => fitCalibration({ type: "noul", method: "contextual", probes: [[0.5, 0.5]], points: [{ probabilityTrue: -1, label: true }], labelCount: 2 })).toThrow("points[0].probabilityTrue");
  });
});
