import type { SupervisorClock } from "../../src/upstream/embedded-supervisor.js";

/**
 * A clock that moves only when the test moves it: the waits a supervisor
 * asks for are recorded, and end when `advance` passes their time. No test
 * sleeps through a wait.
 */
export interface ManualClock extends SupervisorClock {
  /** The next wait asked for (in ms), once the code under test waits. */
  nextSleep(): Promise<number>;
  advance(ms: number): void;
}

export function createManualClock(startMs = 1_800_000_000_000): ManualClock {
  let now = startMs;
  const sleepers: Array<{ at: number; resolve: () => void }> = [];
  const asked: number[] = [];
  const waiting: Array<(ms: number) => void> = [];
  return {
    now: () => now,
    sleep(ms, signal) {
      return new Promise<void>((resolve, reject) => {
        const sleeper = { at: now + ms, resolve };
        sleepers.push(sleeper);
        signal.addEventListener(
          "abort",
          () => {
            sleepers.splice(sleepers.indexOf(sleeper), 1);
            reject(signal.reason);
          },
          { once: true },
        );
        const waiter = waiting.shift();
        if (waiter) waiter(ms);
        else asked.push(ms);
      });
    },
    nextSleep() {
      const ms = asked.shift();
      return ms === undefined ? new Promise((resolve) => waiting.push(resolve)) : Promise.resolve(ms);
    },
    advance(ms) {
      now += ms;
      for (const sleeper of sleepers.filter((s) => s.at <= now)) {
        sleepers.splice(sleepers.indexOf(sleeper), 1);
        sleeper.resolve();
      }
    },
  };
}
