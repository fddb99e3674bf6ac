import { describe, expect, it } from "vitest";
import { sigmoid, softmax } from "../../src/evaluation/calibration-apply.js";
import { fitCalibration } from "../../src/evaluation/calibration-fit.js";
import { noulMetrics, type DistributionPoint, type NoulPoint } from "../../src/evaluation/metrics.js";
import { seededRandom } from "../../src/evaluation/seeded-random.js";

/**
 * The proof at the level of the math: answers drawn from a known true
 * distribution, distorted the way a model distorts them, and the fits must
 * undo the distortion on answers they were not fitted on. Each test draws its
 * own data (the same, from the same seed), so mutation testing runs only the
 * tests that reach a mutant.
 */
function generator(seed: number) {
  const random = seededRandom(seed);
  return {
    random,
    normal: () => Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random()),
    draw: (probabilities: readonly number[]) => {
      let u = random();
      for (let k = 0; k < probabilities.length - 1; k++) {
        u -= probabilities[k]!;
        if (u < 0) return k;
      }
      return probabilities.length - 1;
    },
  };
}

/** 2,000 noul answers whose log-odds are 3 × the true log-odds + 1, labels drawn from the truth. */
function miscalibratedNoul(): NoulPoint[] {
  const { random, normal } = generator(42);
  return Array.from({ length: 2_000 }, () => {
    const trueLogOdds = 1.2 * normal();
    return { probabilityTrue: sigmoid(3 * trueLogOdds + 1), label: random() < sigmoid(trueLogOdds) };
  });
}

describe("noul: the model's log-odds are 3 × the true log-odds + 1", () => {
  it("the raw answers are miscalibrated: ECE above 0.1", () => {
    expect(noulMetrics(miscalibratedNoul()).ece!).toBeGreaterThan(0.1);
  });

  it("Platt: held-out ECE at most a third of the raw one, Brier and log loss lower, the distortion's inverse recovered", () => {
    const points = miscalibratedNoul();
    const fit = fitCalibration({ type: "noul", method: "platt", points });
    expect(fit.heldOut.before.ece).toBeCloseTo(noulMetrics(points).ece!, 12);
    expect(fit.heldOut.after.ece!).toBeLessThanOrEqual(fit.heldOut.before.ece! / 3);
    expect(fit.heldOut.after.brier!).toBeLessThan(fit.heldOut.before.brier!);
    expect(fit.heldOut.after.logLoss!).toBeLessThan(fit.heldOut.before.logLoss!);
    // true log-odds = (x − 1) / 3.
    if (fit.params.method !== "platt") throw new Error("expected Platt parameters");
    expect(fit.params.slope).toBeCloseTo(1 / 3, 1);
    expect(fit.params.intercept).toBeCloseTo(-1 / 3, 1);
  });

  it("isotonic: held-out ECE at most half the raw one, Brier lower, the steps non-decreasing", () => {
    const fit = fitCalibration({ type: "noul", method: "isotonic", points: miscalibratedNoul() });
    expect(fit.heldOut.after.ece!).toBeLessThanOrEqual(fit.heldOut.before.ece! / 2);
    expect(fit.heldOut.after.brier!).toBeLessThan(fit.heldOut.before.brier!);
    if (fit.params.method !== "isotonic") throw new Error("expected isotonic parameters");
    const { y } = fit.params;
    y.slice(1).forEach((value, i) => expect(value).toBeGreaterThanOrEqual(y[i]!));
  });
});

describe("choice: a constant bias towards the first option", () => {
  it("contextual calibration removes most of it", () => {
    const { normal, draw } = generator(7);
    // The model multiplies the first option's probability by 6, whatever the state: the bias a content-free probe shows.
    const bias = [6, 1, 1];
    const distort = (q: readonly number[]) => {
      const scaled = q.map((p, k) => p * bias[k]!);
      const sum = scaled.reduce((a, b) => a + b, 0);
      return scaled.map((p) => p / sum);
    };
    const points: DistributionPoint[] = Array.from({ length: 2_000 }, () => {
      const truth = softmax([normal(), normal(), normal()]);
      return { probabilities: distort(truth), label: draw(truth) };
    });
    // The content-free state's true distribution is uniform; the model answers it with its bias alone.
    const probe = distort([1 / 3, 1 / 3, 1 / 3]);
    const excess = (rows: readonly { probabilities: readonly number[]; label: number }[]) =>
      rows.reduce((s, row) => s + row.probabilities[0]!, 0) / rows.length - rows.filter((row) => row.label === 0).length / rows.length;

    const fit = fitCalibration({ type: "choice", method: "contextual", probes: [probe], points, labelCount: 3 });
    if (fit.params.method !== "contextual") throw new Error("expected contextual parameters");
    const divided = points.map((point) => point.probabilities.map((p, k) => p / probe[k]!));
    const after = excess(divided.map((row, i) => ({ probabilities: row.map((p) => p / row.reduce((a, b) => a + b, 0)), label: points[i]!.label })));
    expect(excess(points)).toBeGreaterThan(0.25);
    expect(Math.abs(after)).toBeLessThan(excess(points) / 5);
    expect(fit.heldOut.after.ece!).toBeLessThan(fit.heldOut.before.ece! / 3);
    expect(fit.heldOut.after.accuracy!).toBeGreaterThan(fit.heldOut.before.accuracy!);
    expect(fit.heldOut.after.logLoss!).toBeLessThan(fit.heldOut.before.logLoss!);
  });
});

describe("choice: an overconfident model, logits doubled", () => {
  const truths = () => {
    const g = generator(11);
    return { ...g, logits: Array.from({ length: 2_000 }, () => [0, 0, 0, 0].map(() => 1.5 * g.normal())) };
  };

  it("temperature scaling recovers T = 2", () => {
    const { logits, draw } = truths();
    const points = logits.map((z) => ({ probabilities: softmax(z.map((v) => 2 * v)), label: draw(softmax(z)) }));
    const fit = fitCalibration({ type: "choice", method: "temperature", points, labelCount: 4 });
    if (fit.params.method !== "temperature") throw new Error("expected a temperature");
    expect(fit.params.temperature).toBeGreaterThan(1.85);
    expect(fit.params.temperature).toBeLessThan(2.15);
    expect(fit.heldOut.after.ece!).toBeLessThan(fit.heldOut.before.ece! / 3);
  });

  it("vector scaling recovers T = 2 and the label biases", () => {
    const { logits, draw } = truths();
    const shift = [1, 0, -0.5, -0.5];
    const points = logits.map((z) => ({ probabilities: softmax(z.map((v, k) => 2 * v + shift[k]!)), label: draw(softmax(z)) }));
    const fit = fitCalibration({ type: "score", method: "vector", points, labelCount: 4 });
    if (fit.params.method !== "vector") throw new Error("expected vector parameters");
    expect(fit.params.temperature).toBeGreaterThan(1.8);
    expect(fit.params.temperature).toBeLessThan(2.2);
    // log p / 2 = z + shift / 2 + a constant: the biases must cancel shift / 2.
    fit.params.biases.forEach((b, k) => expect(Math.abs(b + shift[k]! / 2)).toBeLessThan(0.15));
    expect(fit.heldOut.after.logLoss!).toBeLessThan(fit.heldOut.before.logLoss!);
  });
});
