import { execFile } from "node:child_process";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { applyCalibration, logOdds, LOGIT_EPS, sigmoid, softmax } from "../../src/evaluation/calibration-apply.js";
import { fitIsotonic, fitPlatt, fitTemperature, fitVectorScaling, VECTOR_BIAS_PRECISION } from "../../src/evaluation/calibration-fit.js";
import { choiceMetrics, noulMetrics, scoreMetrics, type DistributionPoint, type NoulPoint, type ReliabilityBin } from "../../src/evaluation/metrics.js";
import { seededRandom } from "../../src/evaluation/seeded-random.js";

/**
 * The evaluation math against an independent implementation: scikit-learn
 * (Debian's python3-sklearn, which `.ci/run` installs), numpy and scipy
 * compute the same metrics and fits on the same fixtures
 * (test/polyglot/sklearn-reference.py). The tolerances are the ones
 * docs/evaluations.md states.
 */
const execFileAsync = promisify(execFile);
const python = process.env.TYPESAFE_PYTHON ?? "/usr/bin/python3";
/** Closed-form metrics: only the order of a float sum differs. */
const EXACT = 1e-12;
/** Fits found by different optimisers: scipy's L-BFGS-B (gtol 1e-6), Brent and BFGS against our Newton steps and bisection. */
const FITTED = 1e-6;

const random = seededRandom(2024);
const normal = () => Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random());
const round2 = (p: number) => Math.round(p * 100) / 100;
const draw = (probabilities: readonly number[]) => {
  let u = random();
  for (let k = 0; k < probabilities.length - 1; k++) {
    u -= probabilities[k]!;
    if (u < 0) return k;
  }
  return probabilities.length - 1;
};

// Rounded to two decimals, many answers tie and many sit exactly on a bin edge (0.3, 0.6, 0.7 …).
const noulPoints: NoulPoint[] = [
  ...Array.from({ length: 400 }, () => {
    const t = 1.2 * normal();
    return { probabilityTrue: round2(sigmoid(2 * t + 0.5)), label: random() < sigmoid(t) };
  }),
  // Certain answers, right and wrong (the log loss clips them), and the edges of the bins and of the 0.5 threshold.
  ...([
    [0, false],
    [1, true],
    [1, false],
    [0, true],
    [0.1, false],
    [0.5, true],
    [0.5, false],
    [0.3, true],
    [0.6, false],
    [0.7, true],
    [0.9, true],
  ] as const).map(([probabilityTrue, label]) => ({ probabilityTrue, label })),
];

const distributionPoints = (count: number, k: number): DistributionPoint[] => [
  ...Array.from({ length: count }, () => {
    const z = Array.from({ length: k }, () => normal());
    return { probabilities: softmax(z.map((v) => 2 * v)), label: draw(softmax(z)) };
  }),
  { probabilities: [1, ...new Array<number>(k - 1).fill(0)], label: 1 },
  { probabilities: new Array<number>(k).fill(1 / k), label: k - 1 },
  { probabilities: [0.5, 0.5, ...new Array<number>(k - 2).fill(0)], label: 0 },
];
const choicePoints = distributionPoints(300, 4);
const scorePoints = distributionPoints(300, 5);
const grid = Array.from({ length: 121 }, (_, i) => -0.1 + i / 100);
const plattX = noulPoints.map((p) => logOdds([p.probabilityTrue, 1 - p.probabilityTrue]));
const plattGrid = Array.from({ length: 61 }, (_, i) => -30 + i);

let scratch: string;
let reference: Awaited<ReturnType<typeof runReference>>;

async function runReference() {
  const fixtures = {
    noul: { p: noulPoints.map((p) => p.probabilityTrue), y: noulPoints.map((p) => (p.label ? 1 : 0)) },
    choice: { probabilities: choicePoints.map((p) => p.probabilities), labels: choicePoints.map((p) => p.label) },
    score: { probabilities: scorePoints.map((p) => p.probabilities), labels: scorePoints.map((p) => p.label) },
    isotonic: { x: noulPoints.map((p) => p.probabilityTrue), y: noulPoints.map((p) => (p.label ? 1 : 0)), at: grid },
    platt: { x: plattX, y: noulPoints.map((p) => (p.label ? 1 : 0)), at: plattGrid },
    temperature: { probabilities: choicePoints.map((p) => p.probabilities), labels: choicePoints.map((p) => p.label), floor: LOGIT_EPS },
    vector: { probabilities: choicePoints.map((p) => p.probabilities), labels: choicePoints.map((p) => p.label), floor: LOGIT_EPS, biasPrecision: 1 / VECTOR_BIAS_PRECISION },
  };
  const file = path.join(scratch, "fixtures.json");
  await fs.writeFile(file, JSON.stringify(fixtures));
  const { stdout } = await execFileAsync(python, [path.join(import.meta.dirname, "sklearn-reference.py"), file], { timeout: 60_000 });
  type Reliability = { ece: number; counts: number[]; meanPredicted: number[]; observedFrequency: number[] };
  type Distribution = { accuracy: number; macroF1: number; confusion: number[][]; logLoss: number; brier: number; meanAbsoluteError: number; reliability: Reliability };
  return JSON.parse(stdout) as {
    sklearn: string;
    noul: { accuracy: number; brier: number; logLoss: number; auroc: number; reliability: Reliability };
    choice: Distribution;
    score: Distribution;
    isotonic: { x: number[]; y: number[]; predictions: number[] };
    platt: { slope: number; intercept: number; predictions: number[] };
    temperature: { temperature: number };
    vector: { temperature: number; biases: number[] };
  };
}

beforeAll(async () => {
  scratch = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-sklearn-"));
  reference = await runReference();
});
afterAll(async () => {
  if (scratch) await fs.rm(scratch, { recursive: true, force: true });
});

const near = (actual: number | null, expected: number, tolerance: number) => {
  expect(actual).not.toBeNull();
  expect(Math.abs(actual! - expected)).toBeLessThanOrEqual(tolerance);
};
const nearAll = (actual: readonly number[], expected: readonly number[], tolerance: number) => {
  expect(actual).toHaveLength(expected.length);
  actual.forEach((a, i) => near(a, expected[i]!, tolerance));
};
/** Our ten bins against calibration_curve's non-empty ones. */
const sameReliability = (bins: readonly ReliabilityBin[], ece: number | null, expected: { ece: number; counts: number[]; meanPredicted: number[]; observedFrequency: number[] }) => {
  expect(bins.map((b) => b.count)).toEqual(expected.counts);
  const nonempty = bins.filter((b) => b.count > 0);
  nearAll(nonempty.map((b) => b.meanPredicted!), expected.meanPredicted, EXACT);
  nearAll(nonempty.map((b) => b.observedFrequency!), expected.observedFrequency, EXACT);
  near(ece, expected.ece, EXACT);
};

describe("the evaluation math against scikit-learn", () => {
  it("runs Debian's scikit-learn", () => {
    expect(reference.sklearn).toMatch(/^1\./);
  });

  it("noul: accuracy, brier_score_loss, log_loss, roc_auc_score, and calibration_curve's bins", () => {
    const m = noulMetrics(noulPoints);
    near(m.accuracy, reference.noul.accuracy, EXACT);
    near(m.brier, reference.noul.brier, EXACT);
    near(m.logLoss, reference.noul.logLoss, EXACT);
    near(m.auroc, reference.noul.auroc, EXACT);
    sameReliability(m.reliability, m.ece, reference.noul.reliability);
  });

  it.each(["choice", "score"] as const)("%s: accuracy, f1_score(macro), confusion_matrix, log_loss, multi-class Brier, top-label bins", (type) => {
    const points = type === "choice" ? choicePoints : scorePoints;
    const names = points[0]!.probabilities.map((_, k) => `option ${k}`);
    const expected = reference[type];
    const m = type === "choice" ? choiceMetrics(points, names) : scoreMetrics(points, names);
    near("accuracy" in m ? m.accuracy : m.exactAccuracy, expected.accuracy, EXACT);
    near(m.logLoss, expected.logLoss, EXACT);
    near(m.brier, expected.brier, EXACT);
    sameReliability(m.reliability, m.topLabelEce, expected.reliability);
    if ("confusion" in m) {
      expect(m.confusion).toEqual(expected.confusion);
      near(m.macroF1, expected.macroF1, EXACT);
    } else {
      near(m.meanAbsoluteError, expected.meanAbsoluteError, EXACT);
    }
  });

  it("isotonic: IsotonicRegression(out_of_bounds='clip')'s thresholds and predictions", () => {
    const fit = fitIsotonic(noulPoints.map((p) => p.probabilityTrue), noulPoints.map((p) => (p.label ? 1 : 0)));
    nearAll(fit.x, reference.isotonic.x, EXACT);
    nearAll(fit.y, reference.isotonic.y, EXACT);
    nearAll(grid.map((at) => applyCalibration(fit, [at, 1 - at])[0]!), reference.isotonic.predictions, EXACT);
  });

  it("Platt: _sigmoid_calibration's slope, intercept and predictions", () => {
    const fit = fitPlatt(plattX, noulPoints.map((p) => p.label));
    near(fit.slope, reference.platt.slope, FITTED);
    near(fit.intercept, reference.platt.intercept, FITTED);
    nearAll(plattGrid.map((x) => sigmoid(fit.slope * x + fit.intercept)), reference.platt.predictions, FITTED);
  });

  it("temperature and vector scaling: scipy's minimisers of the same log loss", () => {
    near(fitTemperature(choicePoints).temperature, reference.temperature.temperature, FITTED);
    const vector = fitVectorScaling(choicePoints, 4);
    near(vector.temperature, reference.vector.temperature, FITTED);
    nearAll(vector.biases, reference.vector.biases, FITTED);
  });
});
