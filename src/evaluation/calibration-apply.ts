/**
 * Applying a fitted calibration to one answer's label probabilities. It runs
 * on the decision path, so it is a few arithmetic operations per label (a
 * binary search for isotonic), allocates one small array and never throws on
 * a probability the model could produce. The parameters are plain JSON, stored
 * beside the fit; docs/evaluations.md describes each method.
 */

/**
 * Probabilities are floored at this before a logarithm: a label absent from
 * the model's top tokens reads 0, and its log-odds stay finite (about ±27.6).
 */
export const LOGIT_EPS = 1e-12;

/** noul: p' = σ(slope · logit(p) + intercept) (Platt 1999, on the model's log-odds). */
export interface PlattParams {
  method: "platt";
  slope: number;
  intercept: number;
}

/**
 * noul: a non-decreasing step function of p through the points (x[i], y[i]),
 * linear between them and flat beyond the ends (isotonic regression).
 */
export interface IsotonicParams {
  method: "isotonic";
  x: number[];
  y: number[];
}

/** choice and score: p' = softmax(log p / temperature) (Guo et al. 2017). */
export interface TemperatureParams {
  method: "temperature";
  temperature: number;
}

/** choice and score: p' = softmax(log p / temperature + bias), one bias per label (vector scaling). */
export interface VectorParams {
  method: "vector";
  temperature: number;
  biases: number[];
}

/** any type: p'_k ∝ p_k / probe_k, the probe being the answer to a content-free state (Zhao et al. 2021). */
export interface ContextualParams {
  method: "contextual";
  probe: number[];
}

export type CalibrationParams = PlattParams | IsotonicParams | TemperatureParams | VectorParams | ContextualParams;
export type CalibrationMethod = CalibrationParams["method"];

/**
 * The calibrated label probabilities, in label order. A noul answer is the
 * pair [p(true), p(false)]; the result is such a pair too.
 */
export function applyCalibration(params: CalibrationParams, rawProbabilities: readonly number[]): number[] {
  switch (params.method) {
    case "platt": {
      const p = sigmoid(params.slope * logOdds(rawProbabilities) + params.intercept);
      return [p, 1 - p];
    }
    case "isotonic": {
      const p = interpolate(params.x, params.y, rawProbabilities[0]!);
      return [p, 1 - p];
    }
    case "temperature":
      return softmax(rawProbabilities.map((q) => safeLog(q) / params.temperature));
    case "vector":
      return softmax(rawProbabilities.map((q, k) => safeLog(q) / params.temperature + params.biases[k]!));
    case "contextual":
      return normalise(rawProbabilities.map((q, k) => q / Math.max(params.probe[k]!, LOGIT_EPS)));
  }
}

/** log(p(true) / p(false)) of a noul pair, each floored at LOGIT_EPS. */
export function logOdds(pair: readonly number[]): number {
  return safeLog(pair[0]!) - safeLog(pair[1]!);
}

export function safeLog(p: number): number {
  return Math.log(Math.max(p, LOGIT_EPS));
}

/** 1 / (1 + e^−x): for x below about −709, e^−x overflows to Infinity and the result is 0, as it should be. */
export function sigmoid(x: number): number {
  return 1 / (1 + Math.exp(-x));
}

/** softmax, shifted by the largest value so no term overflows. */
export function softmax(values: readonly number[]): number[] {
  const top = Math.max(...values);
  return normalise(values.map((v) => Math.exp(v - top)));
}

/** Linear interpolation through sorted x, clipped to the ends (numpy.interp on a clipped input). */
export function interpolate(x: readonly number[], y: readonly number[], at: number): number {
  const last = x.length - 1;
  if (!(at > x[0]!)) return y[0]!;
  if (at >= x[last]!) return y[last]!;
  let lo = 0;
  let hi = last;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (x[mid]! <= at) lo = mid;
    else hi = mid;
  }
  return y[lo]! + ((at - x[lo]!) * (y[hi]! - y[lo]!)) / (x[hi]! - x[lo]!);
}

/** Scaled to sum 1; a vector of zeros (no label seen) stays as it is. */
function normalise(values: readonly number[]): number[] {
  const sum = values.reduce((a, b) => a + b, 0);
  return sum > 0 ? values.map((v) => v / sum) : [...values];
}
