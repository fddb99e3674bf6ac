import { setTimeout as delay } from "node:timers/promises";

/**
 * Waits for a condition that another process or a background task makes true
 * (a row released by a sweeper, a process gone), checking every 25 ms and
 * failing after `timeoutMs`. Not a sleep: it returns as soon as the condition holds.
 */
export async function waitFor(condition: () => boolean | Promise<boolean>, what: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await delay(25);
  }
}
