/**
 * Fitting a calibration from an evaluation's labelled answers, and measuring
 * what it buys on answers it was not fitted on. Pure and deterministic: the
 * same points and seed give the same parameters and figures on any machine.
 * docs/evaluations.md states each method, its objective and its papers; the
 * polyglot suite holds Platt and isotonic against scikit-learn.
 */
import {
  applyCalibration,
  logOdds,
  safeLog,
  sigmoid,
  type CalibrationParams,
  type ContextualParams,
  type IsotonicParams,
  type PlattParams,
  type TemperatureParams,
  type VectorParams,
} from "./calibration-apply.js";
import { checkDistributionPoints, checkNoulPoints, choiceMetrics, noulMetrics, type DistributionPoint, type NoulPoint } from "./metrics.js";
import { seededPermutation } from "./seeded-random.js";

/** Fewer labelled answers than this give a fit that measures nothing. */
export const MIN_CALIBRATION_EXAMPLES = 20;
export const DEFAULT_FOLDS = 5;
export const DEFAULT_SEED = 1;
/** The temperature stays within e^±10, as scikit-learn bounds its own search. */
export const LOG_TEMPERATURE_BOUND = 10;
/** Vector scaling's biases carry a Gaussian prior of this precision (unit variance), so a label the fit never saw keeps a finite bias. */
export const VECTOR_BIAS_PRECISION = 1;

/** x values closer than this count as one, as in scikit-learn (float64's resolution). */
export const ISOTONIC_TIE = 1e-15;

/** What a calibration changed, measured on the held-out answers. */
export interface HeldOutMetrics {
  count: number;
  ece: number | null;
  brier: number | null;
  logLoss: number | null;
  accuracy: number | null;
}

export interface CalibrationFit {
  params: CalibrationParams;
  heldOut: {
    /** Each answer is predicted by the parameters fitted on the other folds; contextual needs no labels, so it uses one fold. */
    folds: number;
    seed: number;
    before: HeldOutMetrics;
    after: HeldOutMetrics;
  };
}

export type FitRequest =
  | { type: "noul"; method: "platt" | "isotonic"; points: readonly NoulPoint[]; folds?: number; seed?: number }
  | { type: "choice" | "score"; method: "temperature" | "vector"; points: readonly DistributionPoint[]; labelCount: number; folds?: number; seed?: number }
  | {
      type: "noul" | "choice" | "score";
      method: "contextual";
      /** The answers to the content-free states, each a distribution in label order ([p(true), p(false)] for noul). */
      probes: readonly (readonly number[])[];
      /** Labelled answers to measure the change on (may be empty). */
      points: readonly (NoulPoint | DistributionPoint)[];
      labelCount: number;
    };

/**
 * Fits the parameters on all the points and measures them by k-fold
 * cross-fitting: each answer is calibrated by a fit that never saw it, so
 * `after` is what a new answer can expect. Throws a RangeError naming the
 * field when the points cannot support a fit.
 */
export function fitCalibration(request: FitRequest): CalibrationFit {
  if (request.method === "contextual") {
    const params = contextualParams(request.probes, request.labelCount);
    if (request.type === "noul") checkNoulPoints(request.points as readonly NoulPoint[]);
    else checkDistributionPoints(request.points as readonly DistributionPoint[], request.labelCount);
    const rows = request.points.map((point) => asRow(point));
    return {
      params,
      heldOut: {
        folds: 1,
        seed: 0,
        before: summary(request.type, rows, request.labelCount),
        after: summary(
          request.type,
          rows.map((row) => ({ ...row, probabilities: applyCalibration(params, row.probabilities) })),
          request.labelCount,
        ),
      },
    };
  }
  const folds = request.folds ?? DEFAULT_FOLDS;
  const seed = request.seed ?? DEFAULT_SEED;
  if (!Number.isInteger(folds) || folds < 2) throw new RangeError(`folds: expected an integer of at least 2, got ${folds}`);
  if (request.points.length < Math.max(MIN_CALIBRATION_EXAMPLES, folds)) {
    throw new RangeError(`points: a fit needs at least ${Math.max(MIN_CALIBRATION_EXAMPLES, folds)} labelled answers, got ${request.points.length}`);
  }
  const labelCount = request.type === "noul" ? 2 : request.labelCount;
  if (request.type === "noul") checkNoulPoints(request.points);
  else checkDistributionPoints(request.points, labelCount);
  const rows = request.points.map((point) => asRow(point));
  const fit = (subset: readonly Row[]): CalibrationParams => {
    switch (request.method) {
      case "platt":
        return fitPlatt(subset.map((row) => logOdds(row.probabilities)), subset.map((row) => row.label === 0));
      case "isotonic":
        return fitIsotonic(subset.map((row) => row.probabilities[0]!), subset.map((row) => (row.label === 0 ? 1 : 0)));
      case "temperature":
        return fitTemperature(subset);
      case "vector":
        return fitVectorScaling(subset, labelCount);
    }
  };
  const fold = foldOf(rows.length, folds, seed);
  const calibrated = rows.map((row) => ({ ...row }));
  for (let f = 0; f < folds; f++) {
    const params = fit(rows.filter((_, i) => fold[i] !== f));
    rows.forEach((row, i) => {
      if (fold[i] === f) calibrated[i]!.probabilities = applyCalibration(params, row.probabilities);
    });
  }
  return {
    params: fit(rows),
    heldOut: { folds, seed, before: summary(request.type, rows, labelCount), after: summary(request.type, calibrated, labelCount) },
  };
}

/** Fold numbers 0 … folds − 1, dealt in turn along a seeded permutation, so fold sizes differ by at most one. */
export function foldOf(count: number, folds: number, seed: number): number[] {
  const fold: number[] = [];
  seededPermutation(count, seed).forEach((index, position) => (fold[index] = position % folds));
  return fold;
}

/**
 * Platt scaling: the logistic regression p = σ(slope · x + intercept) of the
 * labels on x, fitted to Platt's smoothed targets (N₊ + 1)/(N₊ + 2) for a
 * positive and 1/(N₋ + 2) for a negative, as scikit-learn's
 * `_sigmoid_calibration` does. Newton's method with a halving line search
 * (Lin, Lin and Weng 2007); the loss is convex, so it converges from the
 * prior's intercept.
 */
export function fitPlatt(x: readonly number[], positive: readonly boolean[]): PlattParams {
  const positives = positive.filter(Boolean).length;
  const negatives = positive.length - positives;
  const target = positive.map((isPositive) => (isPositive ? (positives + 1) / (positives + 2) : 1 / (negatives + 2)));
  const loss = (slope: number, intercept: number) =>
    x.reduce((sum, xi, i) => {
      const f = slope * xi + intercept;
      // −t·log σ(f) − (1 − t)·log(1 − σ(f)), written without overflow for large |f|.
      return sum + Math.max(f, 0) + Math.log1p(Math.exp(-Math.abs(f))) - target[i]! * f;
    }, 0);
  let slope = 0;
  let intercept = Math.log((positives + 1) / (negatives + 1));
  let current = loss(slope, intercept);
  for (let iteration = 0; iteration < 100; iteration++) {
    let gSlope = 0;
    let gIntercept = 0;
    let hSS = 1e-12;
    let hSI = 0;
    let hII = 1e-12;
    x.forEach((xi, i) => {
      const p = sigmoid(slope * xi + intercept);
      const d = p - target[i]!;
      const w = p * (1 - p);
      gSlope += d * xi;
      gIntercept += d;
      hSS += w * xi * xi;
      hSI += w * xi;
      hII += w;
    });
    if (Math.abs(gSlope) < 1e-10 * x.length && Math.abs(gIntercept) < 1e-10 * x.length) break;
    const determinant = hSS * hII - hSI * hSI;
    const stepSlope = -(hII * gSlope - hSI * gIntercept) / determinant;
    const stepIntercept = -(hSS * gIntercept - hSI * gSlope) / determinant;
    let size = 1;
    while (size > 1e-10) {
      const next = loss(slope + size * stepSlope, intercept + size * stepIntercept);
      if (next <= current) {
        slope += size * stepSlope;
        intercept += size * stepIntercept;
        current = next;
        break;
      }
      size /= 2;
    }
    if (size <= 1e-10) break;
  }
  return { method: "platt", slope, intercept };
}

/**
 * Isotonic regression of y on x by pool-adjacent-violators, as scikit-learn's
 * IsotonicRegression(increasing=True, out_of_bounds="clip"): x values closer
 * than ISOTONIC_TIE to the first of their run are first merged into their mean, and points in the middle of a flat run are
 * dropped (they change no interpolated value).
 */
export function fitIsotonic(x: readonly number[], y: readonly number[]): IsotonicParams {
  // Equal x values are merged below, so their order among themselves does not matter.
  const order = x.map((_, i) => i).sort((a, b) => x[a]! - x[b]!);
  const xs: number[] = [];
  const sums: number[] = [];
  const weights: number[] = [];
  for (const i of order) {
    // On the first point xs is empty: x − undefined is NaN, never below the tie.
    if (x[i]! - xs[xs.length - 1]! < ISOTONIC_TIE) {
      sums[sums.length - 1]! += y[i]!;
      weights[weights.length - 1]!++;
    } else {
      xs.push(x[i]!);
      sums.push(y[i]!);
      weights.push(1);
    }
  }
  // Blocks of pooled points: how many distinct x values, the sum of their y, their weight.
  const blocks: { size: number; sum: number; weight: number }[] = [];
  xs.forEach((_, i) => {
    let block = { size: 1, sum: sums[i]!, weight: weights[i]! };
    while (blocks.length > 0 && blocks[blocks.length - 1]!.sum / blocks[blocks.length - 1]!.weight >= block.sum / block.weight) {
      const previous = blocks.pop()!;
      block = { size: previous.size + block.size, sum: previous.sum + block.sum, weight: previous.weight + block.weight };
    }
    blocks.push(block);
  });
  const fitted = blocks.flatMap((block) => new Array<number>(block.size).fill(block.sum / block.weight));
  // The ends always stay: fitted[−1] and fitted[length] are undefined, unequal to any value.
  const keep = xs.map((_, i) => fitted[i] !== fitted[i - 1] || fitted[i] !== fitted[i + 1]);
  return { method: "isotonic", x: xs.filter((_, i) => keep[i]), y: fitted.filter((_, i) => keep[i]) };
}

/**
 * Temperature scaling: the T minimising the log loss of softmax(log p / T).
 * The loss is convex in β = 1/T, so its derivative Σ (E_β[log p] − log p_label)
 * rises with β; bisection on log β within ±10 finds its zero.
 */
export function fitTemperature(points: readonly Pick<DistributionPoint, "probabilities" | "label">[]): TemperatureParams {
  const logits = points.map((point) => point.probabilities.map(safeLog));
  const slope = (beta: number) =>
    logits.reduce((sum, z, i) => {
      const top = Math.max(...z);
      const e = z.map((v) => Math.exp(beta * (v - top)));
      const total = e.reduce((a, b) => a + b, 0);
      const expected = z.reduce((a, v, k) => a + (e[k]! / total) * v, 0);
      return sum + expected - z[points[i]!.label]!;
    }, 0);
  let lo = -LOG_TEMPERATURE_BOUND;
  let hi = LOG_TEMPERATURE_BOUND;
  if (slope(Math.exp(lo)) >= 0) return { method: "temperature", temperature: Math.exp(-lo) };
  if (slope(Math.exp(hi)) <= 0) return { method: "temperature", temperature: Math.exp(-hi) };
  while (hi - lo > 1e-12) {
    const mid = (lo + hi) / 2;
    if (slope(Math.exp(mid)) < 0) lo = mid;
    else hi = mid;
  }
  return { method: "temperature", temperature: Math.exp(-(lo + hi) / 2) };
}

/**
 * Vector scaling: softmax(β · log p + b), β = 1/T, one bias per label, by
 * damped Newton steps on the log loss plus the biases' Gaussian prior
 * (VECTOR_BIAS_PRECISION), which also fixes the biases' free constant (they sum to
 * zero at the optimum).
 */
export function fitVectorScaling(points: readonly Pick<DistributionPoint, "probabilities" | "label">[], labelCount: number): VectorParams {
  const k = labelCount;
  const logits = points.map((point) => point.probabilities.map(safeLog));
  const size = k + 1;
  const lambda = VECTOR_BIAS_PRECISION;
  const minBeta = Math.exp(-LOG_TEMPERATURE_BOUND);
  const maxBeta = Math.exp(LOG_TEMPERATURE_BOUND);
  const loss = (theta: readonly number[]) => {
    let sum = 0;
    logits.forEach((z, i) => {
      const f = z.map((v, c) => theta[0]! * v + theta[c + 1]!);
      const top = Math.max(...f);
      sum += top + Math.log(f.reduce((a, v) => a + Math.exp(v - top), 0)) - f[points[i]!.label]!;
    });
    for (let c = 1; c < size; c++) sum += (lambda * theta[c]! ** 2) / 2;
    return sum;
  };
  let theta = [1, ...new Array<number>(k).fill(0)];
  let current = loss(theta);
  for (let iteration = 0; iteration < 100; iteration++) {
    const gradient = new Array<number>(size).fill(0);
    const hessian = Array.from({ length: size }, () => new Array<number>(size).fill(0));
    logits.forEach((z, i) => {
      const f = z.map((v, c) => theta[0]! * v + theta[c + 1]!);
      const top = Math.max(...f);
      const e = f.map((v) => Math.exp(v - top));
      const total = e.reduce((a, b) => a + b, 0);
      const q = e.map((v) => v / total);
      // Each label's feature vector is (z_c, one-hot c): the softmax's gradient and Hessian in those features.
      const meanZ = z.reduce((a, v, c) => a + q[c]! * v, 0);
      gradient[0]! += meanZ - z[points[i]!.label]!;
      hessian[0]![0]! += z.reduce((a, v, c) => a + q[c]! * v * v, 0) - meanZ * meanZ;
      for (let c = 0; c < k; c++) {
        gradient[c + 1]! += q[c]! - (c === points[i]!.label ? 1 : 0);
        hessian[0]![c + 1]! += q[c]! * (z[c]! - meanZ);
        hessian[c + 1]![c + 1]! += q[c]!;
        for (let d = 0; d < k; d++) hessian[c + 1]![d + 1]! -= q[c]! * q[d]!;
      }
    });
    for (let c = 1; c < size; c++) {
      hessian[c]![0] = hessian[0]![c]!;
      gradient[c]! += lambda * theta[c]!;
      hessian[c]![c]! += lambda;
    }
    hessian[0]![0]! += 1e-9;
    if (gradient.every((g) => Math.abs(g) < 1e-9 * Math.max(points.length, 1))) break;
    const step = solveLinear(hessian, gradient.map((g) => -g));
    let scale = 1;
    let moved = false;
    while (scale > 1e-10) {
      const next = theta.map((t, c) => t + scale * step[c]!);
      next[0] = Math.min(Math.max(next[0]!, minBeta), maxBeta);
      const value = loss(next);
      if (value <= current) {
        theta = next;
        current = value;
        moved = true;
        break;
      }
      scale /= 2;
    }
    if (!moved) break;
  }
  return { method: "vector", temperature: 1 / theta[0]!, biases: theta.slice(1) };
}

/**
 * Contextual calibration: the probes' distributions (the same question about
 * content-free states), averaged, become the divisor of every answer.
 */
export function contextualParams(probes: readonly (readonly number[])[], labelCount: number): ContextualParams {
  if (probes.length === 0) throw new RangeError("probes: expected at least one content-free answer");
  probes.forEach((probe, i) => {
    if (probe.length !== labelCount) throw new RangeError(`probes[${i}]: expected ${labelCount} probabilities, got ${probe.length}`);
    if (!probe.some((p) => p > 0)) throw new RangeError(`probes[${i}]: no label probability (the probe answered no label)`);
  });
  const probe = new Array<number>(labelCount).fill(0);
  probes.forEach((distribution) => {
    const total = distribution.reduce((a, b) => a + b, 0);
    distribution.forEach((p, c) => (probe[c]! += p / total / probes.length));
  });
  return { method: "contextual", probe };
}

interface Row {
  probabilities: number[];
  label: number;
}

/** Every point as a distribution: a noul point is [p(true), p(false)] with label 0 for true. */
function asRow(point: NoulPoint | DistributionPoint): Row {
  if ("probabilityTrue" in point) return { probabilities: [point.probabilityTrue, 1 - point.probabilityTrue], label: point.label ? 0 : 1 };
  return { probabilities: [...point.probabilities], label: point.label };
}

/** The metrics the evaluation itself reports for the type: noul on p(true), choice and score on the top label. */
function summary(type: FitRequest["type"], rows: readonly Row[], labelCount: number): HeldOutMetrics {
  if (type === "noul") {
    const m = noulMetrics(rows.map((row) => ({ probabilityTrue: row.probabilities[0]!, label: row.label === 0 })));
    return { count: m.count, ece: m.ece, brier: m.brier, logLoss: m.logLoss, accuracy: m.accuracy };
  }
  const m = choiceMetrics(rows, Array.from({ length: labelCount }, (_, c) => String(c)));
  return { count: m.count, ece: m.topLabelEce, brier: m.brier, logLoss: m.logLoss, accuracy: m.accuracy };
}

/**
 * Solves matrix · x = rhs by Gaussian elimination. The matrices here are
 * Hessians plus a ridge, symmetric positive definite, so no pivoting is needed.
 */
export function solveLinear(matrix: readonly (readonly number[])[], rhs: readonly number[]): number[] {
  const n = rhs.length;
  const a = matrix.map((row, i) => [...row, rhs[i]!]);
  for (let col = 0; col < n; col++) {
    for (let row = col + 1; row < n; row++) {
      const factor = a[row]![col]! / a[col]![col]!;
      for (let c = col; c <= n; c++) a[row]![c]! -= factor * a[col]![c]!;
    }
  }
  const x: number[] = [];
  for (let row = n - 1; row >= 0; row--) {
    let sum = a[row]![n]!;
    for (let c = row + 1; c < n; c++) sum -= a[row]![c]! * x[c]!;
    x[row] = sum / a[row]![row]!;
  }
  return x;
}
