import type { SearchWindow } from "../validate.js";

/** The cutoff of a window relative to T; undefined for "any". */
export function windowCutoffMs(window: SearchWindow, nowMs: number): number | undefined {
  switch (window) {
    case "any":
      return undefined;
    case "24h":
      return nowMs - 24 * 3600_000;
    case "7d":
      return nowMs - 7 * 24 * 3600_000;
    case "30d":
      return nowMs - 30 * 24 * 3600_000;
  }
}
