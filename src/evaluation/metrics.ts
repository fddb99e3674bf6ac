/**
 * The metrics of an evaluation: how often the answers were right and how far
 * their probabilities can be trusted. Pure functions of the predictions and
 * labels, no I/O; the results are plain JSON, stored as they are, so their
 * field names are stable. docs/evaluations.md states each formula, the bin
 * rule and the clipping, and the polyglot suite holds them against scikit-learn.
 */

/** Reliability bins: equal width over [0, 1]. */
export const RELIABILITY_BIN_COUNT = 10;
/**
 * Probabilities are clipped to [eps, 1 − eps] before a logarithm, as
 * scikit-learn's log_loss does with its default eps (float64 machine epsilon).
 */
export const LOG_LOSS_EPS = Number.EPSILON;
/** How many examples the drill-down lists unless told otherwise. */
export const LARGEST_ERRORS_DEFAULT = 20;

/** One noul prediction: the probability of `true` and the expected answer. */
export interface NoulPoint {
  probabilityTrue: number;
  label: boolean;
  /** How much of the model's next-token probability the labels held (`x_label_mass`). */
  labelMass?: number;
  exampleId?: string;
}

/** One choice or score prediction: a distribution in option (label) order and the expected option's index. */
export interface DistributionPoint {
  probabilities: readonly number[];
  label: number;
  labelMass?: number;
  exampleId?: string;
}

/** One bin of a reliability table: predictions with lower < p ≤ upper (the first bin also holds 0). */
export interface ReliabilityBin {
  binLower: number;
  binUpper: number;
  count: number;
  /** Mean predicted probability in the bin; null when the bin is empty. */
  meanPredicted: number | null;
  /** Fraction of the bin's predictions that were right; null when the bin is empty. */
  observedFrequency: number | null;
}

/** The spread of `x_label_mass` over the examples that reported it (quantiles interpolate linearly). */
export interface LabelMassSummary {
  count: number;
  mean: number;
  min: number;
  p10: number;
  median: number;
  p90: number;
  max: number;
}

/** An example in the drill-down: its id when it had one, its position in the input, and its error. */
export interface LargestError {
  exampleId: string | null;
  index: number;
  error: number;
}

export interface NoulMetrics {
  count: number;
  /** Right when p ≥ 0.5 answers true and the label is true, or p < 0.5 and the label is false. */
  accuracy: number | null;
  brier: number | null;
  logLoss: number | null;
  ece: number | null;
  reliability: ReliabilityBin[];
  /** Null when the labels hold one class only (the ranking is then undefined). */
  auroc: number | null;
  labelMass: LabelMassSummary | null;
  largestErrors: LargestError[];
}

export interface ChoiceMetrics {
  count: number;
  accuracy: number | null;
  /** Mean F1 over the options that occur as a label or a prediction. */
  macroF1: number | null;
  /** The options, in the order of the confusion matrix's rows and columns. */
  options: string[];
  /** confusion[true][predicted]: counts. */
  confusion: number[][];
  topLabelEce: number | null;
  reliability: ReliabilityBin[];
  /** Multi-class Brier: mean over examples of Σ over options of (p − onehot)², in [0, 2]. */
  brier: number | null;
  logLoss: number | null;
  labelMass: LabelMassSummary | null;
  largestErrors: LargestError[];
}

export interface ScoreMetrics {
  count: number;
  exactAccuracy: number | null;
  /** Mean |predicted level − labelled level|, the predicted level being the most probable one. */
  meanAbsoluteError: number | null;
  topLabelEce: number | null;
  reliability: ReliabilityBin[];
  brier: number | null;
  logLoss: number | null;
  labelMass: LabelMassSummary | null;
  largestErrors: LargestError[];
}

export interface MetricsOptions {
  /** How many examples the drill-down keeps. */
  largestErrors?: number;
}

/** The bin of a probability in [0, 1]: the number of inner edges k/10 strictly below it, so 0.1 is in the first bin and 1.0 in the last. */
export function binIndex(p: number): number {
  let bin = 0;
  while ((bin + 1) / RELIABILITY_BIN_COUNT < p) bin++;
  return bin;
}

/** The reliability table and its ECE: Σ over bins of (bin count / N) · |mean predicted − observed frequency|. */
export function reliability(confidences: readonly number[], outcomes: readonly boolean[]): { ece: number | null; bins: ReliabilityBin[] } {
  const counts = new Array<number>(RELIABILITY_BIN_COUNT).fill(0);
  const sums = new Array<number>(RELIABILITY_BIN_COUNT).fill(0);
  const hits = new Array<number>(RELIABILITY_BIN_COUNT).fill(0);
  confidences.forEach((p, i) => {
    const bin = binIndex(p);
    counts[bin]!++;
    sums[bin]! += p;
    if (outcomes[i]) hits[bin]!++;
  });
  const total = confidences.length;
  let ece = 0;
  const bins = counts.map((count, bin): ReliabilityBin => {
    const binLower = bin / RELIABILITY_BIN_COUNT;
    const binUpper = (bin + 1) / RELIABILITY_BIN_COUNT;
    if (count === 0) return { binLower, binUpper, count, meanPredicted: null, observedFrequency: null };
    const meanPredicted = sums[bin]! / count;
    const observedFrequency = hits[bin]! / count;
    ece += (count / total) * Math.abs(meanPredicted - observedFrequency);
    return { binLower, binUpper, count, meanPredicted, observedFrequency };
  });
  return { ece: total === 0 ? null : ece, bins };
}

/** Noul metrics over the examples that label the question. */
export function noulMetrics(points: readonly NoulPoint[], options: MetricsOptions = {}): NoulMetrics {
  checkNoulPoints(points);
  const count = points.length;
  const p = points.map((point) => point.probabilityTrue);
  const y = points.map((point) => point.label);
  let right = 0;
  let brier = 0;
  let logLoss = 0;
  points.forEach((point) => {
    if (point.probabilityTrue >= 0.5 === point.label) right++;
    brier += (point.probabilityTrue - (point.label ? 1 : 0)) ** 2;
    logLoss -= Math.log(clippedRow([point.probabilityTrue, 1 - point.probabilityTrue])[point.label ? 0 : 1]!);
  });
  const table = reliability(p, y);
  return {
    count,
    accuracy: mean(right, count),
    brier: mean(brier, count),
    logLoss: mean(logLoss, count),
    ece: table.ece,
    reliability: table.bins,
    auroc: auroc(p, y),
    labelMass: labelMassSummary(points),
    largestErrors: largestErrors(
      points,
      points.map((point) => Math.abs(point.probabilityTrue - (point.label ? 1 : 0))),
      options,
    ),
  };
}

/** Choice metrics; `options` names the probabilities' positions. */
export function choiceMetrics(points: readonly DistributionPoint[], options: readonly string[], settings: MetricsOptions = {}): ChoiceMetrics {
  const shared = distributionMetrics(points, options.length);
  const k = options.length;
  const confusion = Array.from({ length: k }, () => new Array<number>(k).fill(0));
  points.forEach((point, i) => confusion[point.label]![shared.predicted[i]!]!++);
  return {
    count: shared.count,
    accuracy: shared.accuracy,
    macroF1: macroF1(confusion),
    options: [...options],
    confusion,
    topLabelEce: shared.topLabelEce,
    reliability: shared.reliability,
    brier: shared.brier,
    logLoss: shared.logLoss,
    labelMass: labelMassSummary(points),
    largestErrors: largestErrors(
      points,
      points.map((point) => 1 - point.probabilities[point.label]!),
      settings,
    ),
  };
}

/** Score metrics; `labels` are the levels in order, so index distance is the distance in label steps. */
export function scoreMetrics(points: readonly DistributionPoint[], labels: readonly string[], settings: MetricsOptions = {}): ScoreMetrics {
  const shared = distributionMetrics(points, labels.length);
  let distance = 0;
  points.forEach((point, i) => (distance += Math.abs(shared.predicted[i]! - point.label)));
  return {
    count: shared.count,
    exactAccuracy: shared.accuracy,
    meanAbsoluteError: mean(distance, shared.count),
    topLabelEce: shared.topLabelEce,
    reliability: shared.reliability,
    brier: shared.brier,
    logLoss: shared.logLoss,
    labelMass: labelMassSummary(points),
    // The expected distance in steps: a confident answer two levels off weighs more than one a level off.
    largestErrors: largestErrors(
      points,
      points.map((point) => point.probabilities.reduce((sum, q, level) => sum + q * Math.abs(level - point.label), 0)),
      settings,
    ),
  };
}

/** The metrics every distribution shares, with the predicted index (the first most probable). */
function distributionMetrics(points: readonly DistributionPoint[], k: number) {
  checkDistributionPoints(points, k);
  const count = points.length;
  const predicted = points.map((point) => argmax(point.probabilities));
  let right = 0;
  let brier = 0;
  let logLoss = 0;
  points.forEach((point, i) => {
    if (predicted[i] === point.label) right++;
    point.probabilities.forEach((q, j) => (brier += (q - (j === point.label ? 1 : 0)) ** 2));
    logLoss -= Math.log(clippedRow(point.probabilities)[point.label]!);
  });
  const table = reliability(
    points.map((point, i) => point.probabilities[predicted[i]!]!),
    points.map((point, i) => predicted[i] === point.label),
  );
  return {
    count,
    predicted,
    accuracy: mean(right, count),
    brier: mean(brier, count),
    logLoss: mean(logLoss, count),
    topLabelEce: table.ece,
    reliability: table.bins,
  };
}

/** The first index of the largest probability. */
export function argmax(probabilities: readonly number[]): number {
  let best = 0;
  probabilities.forEach((q, i) => {
    if (q > probabilities[best]!) best = i;
  });
  return best;
}

/** A distribution clipped to [eps, 1 − eps] and renormalised to sum 1, as scikit-learn's log_loss reads it. */
export function clippedRow(probabilities: readonly number[]): number[] {
  const clipped = probabilities.map((q) => Math.min(Math.max(q, LOG_LOSS_EPS), 1 - LOG_LOSS_EPS));
  const sum = clipped.reduce((a, b) => a + b, 0);
  return clipped.map((q) => q / sum);
}

/**
 * Area under the ROC curve: the chance a random positive gets a higher
 * probability than a random negative, ties counting a half (Mann–Whitney).
 */
export function auroc(scores: readonly number[], labels: readonly boolean[]): number | null {
  const positives = labels.filter(Boolean).length;
  const negatives = labels.length - positives;
  if (positives === 0 || negatives === 0) return null;
  const order = scores.map((_, i) => i).sort((a, b) => scores[a]! - scores[b]!);
  let rankSum = 0;
  let start = 0;
  while (start < order.length) {
    let end = start;
    // Past the end, scores[undefined] is undefined, which equals no score.
    while (scores[order[end + 1]!] === scores[order[start]!]) end++;
    const averageRank = (start + end) / 2 + 1;
    for (let i = start; i <= end; i++) if (labels[order[i]!]) rankSum += averageRank;
    start = end + 1;
  }
  return (rankSum - (positives * (positives + 1)) / 2) / (positives * negatives);
}

/** Macro F1 over the classes that occur as a label or a prediction: F1 = 2TP / (2TP + FP + FN). */
export function macroF1(confusion: readonly (readonly number[])[]): number | null {
  let sum = 0;
  let classes = 0;
  confusion.forEach((row, c) => {
    const truePositives = row[c]!;
    const actual = row.reduce((a, b) => a + b, 0);
    const predicted = confusion.reduce((a, r) => a + r[c]!, 0);
    if (actual + predicted === 0) return;
    sum += (2 * truePositives) / (actual + predicted);
    classes++;
  });
  return classes === 0 ? null : sum / classes;
}

/** The spread of the label mass over the points that carry one; null when none does. */
export function labelMassSummary(points: readonly { labelMass?: number }[]): LabelMassSummary | null {
  const masses = points.flatMap((point) => (point.labelMass === undefined ? [] : [point.labelMass])).sort((a, b) => a - b);
  if (masses.length === 0) return null;
  return {
    count: masses.length,
    mean: masses.reduce((a, b) => a + b, 0) / masses.length,
    min: masses[0]!,
    p10: quantile(masses, 0.1),
    median: quantile(masses, 0.5),
    p90: quantile(masses, 0.9),
    max: masses[masses.length - 1]!,
  };
}

/** Linear interpolation between the closest ranks of sorted values (numpy's default quantile). */
export function quantile(sorted: readonly number[], q: number): number {
  const position = (sorted.length - 1) * q;
  const below = Math.floor(position);
  const above = Math.min(below + 1, sorted.length - 1);
  return sorted[below]! + (position - below) * (sorted[above]! - sorted[below]!);
}

/** The `limit` largest errors, largest first; equal errors keep input order (the sort is stable). */
function largestErrors(points: readonly { exampleId?: string }[], errors: readonly number[], options: MetricsOptions): LargestError[] {
  const limit = options.largestErrors ?? LARGEST_ERRORS_DEFAULT;
  return errors
    .map((error, index) => ({ exampleId: points[index]!.exampleId ?? null, index, error }))
    .sort((a, b) => b.error - a.error)
    .slice(0, limit);
}

function mean(sum: number, count: number): number | null {
  return count === 0 ? null : sum / count;
}

/** Throws a RangeError naming the first point whose probability is not in [0, 1]. */
export function checkNoulPoints(points: readonly Pick<NoulPoint, "probabilityTrue">[]): void {
  points.forEach((point, i) => checkProbability(point.probabilityTrue, `points[${i}].probabilityTrue`));
}

/** Throws a RangeError naming the first point with the wrong number of probabilities, one outside [0, 1], or a label that is no index below k. */
export function checkDistributionPoints(points: readonly Pick<DistributionPoint, "probabilities" | "label">[], k: number): void {
  points.forEach((point, i) => {
    if (point.probabilities.length !== k) throw new RangeError(`points[${i}].probabilities: expected ${k} probabilities, got ${point.probabilities.length}`);
    point.probabilities.forEach((q, j) => checkProbability(q, `points[${i}].probabilities[${j}]`));
    if (!Number.isInteger(point.label) || point.label < 0 || point.label >= k) throw new RangeError(`points[${i}].label: expected an index below ${k}, got ${point.label}`);
  });
}

function checkProbability(p: number, field: string): void {
  if (!(p >= 0 && p <= 1)) throw new RangeError(`${field}: expected a probability in [0, 1], got ${p}`);
}
