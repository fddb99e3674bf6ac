import { creditsNumberToUnits } from "../units.js";
import type { Violation } from "../validation.js";
import { MAX_THRESHOLDS } from "./events.js";

/** The largest threshold: far above any balance, far below what units can count. */
export const MAX_THRESHOLD_CREDITS = 1_000_000_000;

/** Thresholds in credits, as a caller sends them, to units; or the violations of `field`. */
export function thresholdViolations(field: string, credits: readonly number[]): { units: number[]; violations: Violation[] } {
  if (credits.length > MAX_THRESHOLDS) return { units: [], violations: [{ field, rule: `at most ${MAX_THRESHOLDS} thresholds` }] };
  const units: number[] = [];
  const violations: Violation[] = [];
  credits.forEach((value, i) => {
    const rule = `each above 0 and at most ${MAX_THRESHOLD_CREDITS} credits, with at most 6 decimals`;
    if (!Number.isFinite(value) || value <= 0 || value > MAX_THRESHOLD_CREDITS) {
      violations.push({ field: `${field}[${i}]`, rule });
      return;
    }
    const amount = creditsNumberToUnits(value);
    if (amount === undefined) violations.push({ field: `${field}[${i}]`, rule });
    else units.push(amount);
  });
  return { units, violations };
}
