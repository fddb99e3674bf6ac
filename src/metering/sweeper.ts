import type { Logger } from "../logger.js";

/** Runs a sweep of expired holds every interval, one at a time, until stopped. */
export interface Sweeper {
  /** Starts the periodic sweep; a second start does nothing. */
  start(): void;
  /** Stops the sweeps and waits for one in progress. */
  stop(): Promise<void>;
}

/**
 * The safety net for holds whose call never came back: a sweep every
 * `intervalMs`, skipped while the previous one still runs. Its timer does not
 * keep the process alive, and a failed sweep is logged and tried again at the
 * next tick.
 */
export function createSweeper(sweepNow: () => Promise<number>, intervalMs: number, logger: Logger): Sweeper {
  let timer: NodeJS.Timeout | undefined;
  let sweeping: Promise<void> | undefined;
  return {
    start() {
      if (timer) return;
      timer = setInterval(() => {
        if (sweeping) return;
        sweeping = sweepNow()
          .then(() => undefined, (err: unknown) => logger.warn("sweep failed", { err }))
          .finally(() => {
            sweeping = undefined;
          });
      }, intervalMs);
      timer.unref();
    },
    async stop() {
      if (timer) clearInterval(timer);
      timer = undefined;
      await sweeping;
    },
  };
}
