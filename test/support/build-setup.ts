import { buildIfStale } from "./process.js";

/**
 * Builds dist/ when a source is newer, before any file runs, so two workers
 * never build it at once: test service processes and the CLI run dist/, as
 * users do. Not in the mutation config: its sandbox's sources always look
 * newer, and none of its tests runs dist/.
 */
export default function setup(): void {
  buildIfStale();
}
