import { describe, expect, it } from "vitest";
import {
  auroc,
  binIndex,
  choiceMetrics,
  clippedRow,
  labelMassSummary,
  LOG_LOSS_EPS,
  macroF1,
  noulMetrics,
  quantile,
  reliability,
  scoreMetrics,
  type NoulPoint,
} from "../../src/evaluation/metrics.js";

// Every expected value below is worked by hand from the formulas in docs/evaluations.md.

const noul = (pairs: [number, boolean][], masses: (number | undefined)[] = []): NoulPoint[] =>
  pairs.map(([probabilityTrue, label], i) => ({ probabilityTrue, label, exampleId: `e${i}`, ...(masses[i] === undefined ? {} : { labelMass: masses[i] }) }));

describe("binIndex: equal-width bins (k/10, (k+1)/10], the first also holding 0", () => {
  it.each([
    [0, 0],
    [0.05, 0],
    [0.1, 0],
    [0.1000001, 1],
    [0.2, 1],
    [0.3, 2],
    [0.30000000000000004, 3],
    [0.5, 4],
    [0.6, 5],
    [0.7, 6],
    [0.9, 8],
    [0.95, 9],
    [1, 9],
  ])("%s is in bin %i", (p, bin) => {
    expect(binIndex(p)).toBe(bin);
  });
});

describe("noulMetrics", () => {
  it("six answers, one per bin: accuracy, Brier, log loss, ECE and AUROC by hand", () => {
    const m = noulMetrics(noul([[0.9, true], [0.8, true], [0.3, false], [0.6, false], [0.1, false], [0.5, true]]));
    expect(m.count).toBe(6);
    // p ≥ 0.5 answers true: 0.6 (false) is the one miss; 0.5 (true) is right.
    expect(m.accuracy).toBeCloseTo(5 / 6, 12);
    expect(m.brier).toBeCloseTo((0.01 + 0.04 + 0.09 + 0.36 + 0.01 + 0.25) / 6, 12);
    expect(m.logLoss).toBeCloseTo(-(2 * Math.log(0.9) + Math.log(0.8) + Math.log(0.7) + Math.log(0.4) + Math.log(0.5)) / 6, 12);
    // Each bin holds one answer, so ECE is the mean |p − y|.
    expect(m.ece).toBeCloseTo((0.1 + 0.2 + 0.3 + 0.6 + 0.1 + 0.5) / 6, 12);
    // Positives 0.9, 0.8, 0.5 against negatives 0.3, 0.6, 0.1: 3 + 3 + 2 of 9 pairs ranked right.
    expect(m.auroc).toBeCloseTo(8 / 9, 12);
  });

  it("shared bins: the gap is weighted by the bin's count, 0.1 falls in the first bin and 1.0 in the last", () => {
    const m = noulMetrics(noul([[0.05, false], [0.1, true], [0.15, false], [0.85, true], [0.95, true], [1, false]]));
    // bin 0: {0.05, 0.1} gap |0.075 − 0.5|; bin 1: {0.15} 0.15; bin 8: {0.85} 0.15; bin 9: {0.95, 1} |0.975 − 0.5|.
    expect(m.ece).toBeCloseTo((2 * 0.425 + 0.15 + 0.15 + 2 * 0.475) / 6, 12);
    expect(m.reliability).toHaveLength(10);
    expect(m.reliability.map((b) => b.count)).toEqual([2, 1, 0, 0, 0, 0, 0, 0, 1, 2]);
    expect(m.reliability[0]).toEqual({ binLower: 0, binUpper: 0.1, count: 2, meanPredicted: expect.closeTo(0.075, 12), observedFrequency: 0.5 });
    expect(m.reliability[9]!.meanPredicted).toBeCloseTo(0.975, 12);
    expect(m.reliability[9]!.observedFrequency).toBe(0.5);
    expect(m.reliability[3]).toEqual({ binLower: 0.3, binUpper: 0.4, count: 0, meanPredicted: null, observedFrequency: null });
    // A certain wrong answer costs −log(eps), as scikit-learn clips it.
    expect(m.logLoss).toBeCloseTo(
      -(Math.log(0.95) + Math.log(0.1) + Math.log(0.85) + Math.log(0.85) + Math.log(0.95) + Math.log(clippedRow([1, 0])[1]!)) / 6,
      9,
    );
  });

  it.each([
    { name: "all ties", points: noul([[0.5, true], [0.5, false], [0.5, true], [0.5, false]]), auroc: 0.5 },
    { name: "a tie across classes counts a half", points: noul([[0.2, false], [0.2, true], [0.8, true]]), auroc: 0.75 },
    { name: "perfect ranking", points: noul([[0.4, false], [0.45, true]]), auroc: 1 },
    { name: "inverted ranking", points: noul([[0.9, false], [0.1, true]]), auroc: 0 },
    { name: "true only", points: noul([[0.9, true], [0.2, true]]), auroc: null },
    { name: "false only", points: noul([[0.9, false], [0.2, false]]), auroc: null },
  ])("AUROC, $name", ({ points, auroc: expected }) => {
    expect(noulMetrics(points).auroc).toBe(expected);
  });

  it("no points: counts zero, rates null, every bin empty", () => {
    const m = noulMetrics([]);
    expect(m).toMatchObject({ count: 0, accuracy: null, brier: null, logLoss: null, ece: null, auroc: null, labelMass: null, largestErrors: [] });
    expect(m.reliability.every((b) => b.count === 0)).toBe(true);
  });

  it("the largest errors come first, ties in input order, cut at the limit", () => {
    const m = noulMetrics(noul([[0.9, true], [0.2, true], [0.8, false], [0.6, true], [0.2, true]]), { largestErrors: 3 });
    expect(m.largestErrors.map((e) => [e.exampleId, e.index])).toEqual([
      ["e1", 1],
      ["e2", 2],
      ["e4", 4],
    ]);
    expect(m.largestErrors[0]!.error).toBeCloseTo(0.8, 12);
    expect(noulMetrics([{ probabilityTrue: 0.3, label: true }]).largestErrors).toEqual([{ exampleId: null, index: 0, error: 0.7 }]);
  });

  it.each([-0.1, 1.2, Number.NaN])("refuses the probability %s, naming the point", (p) => {
    expect(() => noulMetrics(noul([[0.5, true], [p, false]]))).toThrow("points[1].probabilityTrue");
  });
});

describe("choiceMetrics", () => {
  const points = [
    { probabilities: [0.7, 0.2, 0.1], label: 0, labelMass: 0.9, exampleId: "a" },
    { probabilities: [0.2, 0.5, 0.3], label: 2, labelMass: 0.5, exampleId: "b" },
    { probabilities: [0.1, 0.3, 0.6], label: 2, labelMass: 0.7, exampleId: "c" },
    // A tie predicts the first option, as numpy's argmax does.
    { probabilities: [0.4, 0.4, 0.2], label: 1, labelMass: 1, exampleId: "d" },
  ];
  // Computed inside each test, so mutation testing runs only the tests that reach a mutant.
  const metrics = () => choiceMetrics(points, ["red", "green", "blue"]);

  it("accuracy and the confusion matrix (rows: labelled, columns: predicted)", () => {
    const m = metrics();
    expect(m.accuracy).toBe(0.5);
    expect(m.options).toEqual(["red", "green", "blue"]);
    expect(m.confusion).toEqual([
      [1, 0, 0],
      [1, 0, 0],
      [0, 1, 1],
    ]);
  });

  it("macro-F1: F1 per option 2/3, 0, 2/3", () => {
    const m = metrics();
    expect(m.macroF1).toBeCloseTo(4 / 9, 12);
  });

  it("multi-class Brier sums the squared error over the options", () => {
    const m = metrics();
    expect(m.brier).toBeCloseTo((0.14 + 0.78 + 0.26 + 0.56) / 4, 12);
  });

  it("log loss and top-label ECE", () => {
    const m = metrics();
    expect(m.logLoss).toBeCloseTo(-(Math.log(0.7) + Math.log(0.3) + Math.log(0.6) + Math.log(0.4)) / 4, 12);
    // Confidences 0.7 (right), 0.5 (wrong), 0.6 (right), 0.4 (wrong), one bin each.
    expect(m.topLabelEce).toBeCloseTo((0.3 + 0.5 + 0.4 + 0.4) / 4, 12);
    expect(m.reliability.map((b) => b.count)).toEqual([0, 0, 0, 1, 1, 1, 1, 0, 0, 0]);
  });

  it("label mass and the drill-down (error = 1 − p of the labelled option)", () => {
    const m = metrics();
    expect(m.labelMass!.count).toBe(4);
    expect(m.labelMass!.mean).toBeCloseTo(0.775, 12);
    expect(m.largestErrors.map((e) => e.exampleId)).toEqual(["b", "d", "c", "a"]);
    expect(m.largestErrors[0]!.error).toBeCloseTo(0.7, 12);
  });

  it.each([
    { name: "wrong length", point: { probabilities: [0.5, 0.5], label: 0 }, message: "points[0].probabilities: expected 3" },
    { name: "label out of range", point: { probabilities: [0.5, 0.5, 0], label: 3 }, message: "points[0].label" },
    { name: "fractional label", point: { probabilities: [0.5, 0.5, 0], label: 0.5 }, message: "points[0].label" },
    { name: "negative label", point: { probabilities: [0.5, 0.5, 0], label: -1 }, message: "points[0].label" },
    { name: "negative probability", point: { probabilities: [0.5, -0.5, 1], label: 0 }, message: "points[0].probabilities[1]" },
  ])("refuses $name", ({ point, message }) => {
    expect(() => choiceMetrics([point], ["x", "y", "z"])).toThrow(message);
  });
});

describe("scoreMetrics", () => {
  const points = [
    { probabilities: [0.1, 0.6, 0.3, 0, 0], label: 2 },
    { probabilities: [0, 0, 0, 0.2, 0.8], label: 4 },
    { probabilities: [0.5, 0.5, 0, 0, 0], label: 3 },
  ];
  const metrics = () => scoreMetrics(points, ["0", "1", "2", "3", "4"]);

  it("exact accuracy and mean absolute error in label steps (the most probable level)", () => {
    const m = metrics();
    expect(m.exactAccuracy).toBeCloseTo(1 / 3, 12);
    expect(m.meanAbsoluteError).toBeCloseTo((1 + 0 + 3) / 3, 12);
  });

  it("multi-class Brier and log loss (a zero for the label is clipped)", () => {
    const m = metrics();
    // Σ (p_k − onehot_k)²: 0.01 + 0.36 + 0.49 = 0.86; 0.04 + 0.04 = 0.08; 0.25 + 0.25 + 1 = 1.5.
    expect(m.brier).toBeCloseTo((0.86 + 0.08 + 1.5) / 3, 12);
    expect(m.logLoss).toBeCloseTo(-(Math.log(0.3) + Math.log(0.8) + Math.log(clippedRow([0.5, 0.5, 0, 0, 0])[3]!)) / 3, 12);
  });

  it("top-label ECE, and the drill-down by expected distance in steps", () => {
    const m = metrics();
    // Confidences 0.6 (wrong, bin 5), 0.8 (right, bin 7), 0.5 (wrong, bin 4).
    expect(m.topLabelEce).toBeCloseTo((0.6 + 0.2 + 0.5) / 3, 12);
    expect(m.largestErrors.map((e) => e.index)).toEqual([2, 0, 1]);
    expect(m.largestErrors.map((e) => e.error)).toEqual([2.5, 0.8, expect.closeTo(0.2, 12)]);
  });
});

describe("the parts", () => {
  it("labelMassSummary interpolates its quantiles and skips points without a mass", () => {
    const s = labelMassSummary([{ labelMass: 0.9 }, { labelMass: 0.5 }, {}, { labelMass: 0.7 }, { labelMass: 1 }]);
    expect(s).toEqual({
      count: 4,
      mean: expect.closeTo(0.775, 12),
      min: 0.5,
      p10: expect.closeTo(0.56, 12),
      median: expect.closeTo(0.8, 12),
      p90: expect.closeTo(0.97, 12),
      max: 1,
    });
    expect(labelMassSummary([{}])).toBeNull();
    expect(quantile([3], 0.9)).toBe(3);
  });

  it("clippedRow clips at eps and renormalises", () => {
    expect(clippedRow([0, 1])).toEqual([LOG_LOSS_EPS / (1 + LOG_LOSS_EPS - LOG_LOSS_EPS), (1 - LOG_LOSS_EPS) / 1]);
    expect(clippedRow([0.2, 0.2]).map((q) => q * 2)).toEqual([1, 1]);
  });

  it("macroF1 leaves out an option neither labelled nor predicted", () => {
    expect(
      macroF1([
        [2, 0, 0],
        [0, 0, 0],
        [0, 0, 1],
      ]),
    ).toBe(1);
    expect(macroF1([[0]])).toBeNull();
  });

  it("reliability of nothing has no ECE", () => {
    expect(reliability([], []).ece).toBeNull();
  });

  it("auroc agrees with the pair count on a larger case", () => {
    const scores = [0.1, 0.4, 0.35, 0.8, 0.4, 0.7, 0.2];
    const labels = [false, false, true, true, true, false, true];
    let wins = 0;
    let pairs = 0;
    scores.forEach((s, i) =>
      scores.forEach((t, j) => {
        if (labels[i] && !labels[j]) {
          pairs++;
          wins += s > t ? 1 : s === t ? 0.5 : 0;
        }
      }),
    );
    expect(auroc(scores, labels)).toBeCloseTo(wins / pairs, 12);
  });
});
