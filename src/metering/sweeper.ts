import type { Logger } from "../logger.js";

/** Runs a sweep of expired holds every interval, one at a time, until stopped. */
export interface Sweeper {
  /** Starts the periodic sweep; a second start does nothing. */
  start(): void;
  /** Stops the sweeps, aborts the signal of one in progress, and waits for it. */
  stop(): Promise<void>;
}

/**
 * The safety net for holds whose call never came back: a sweep every
 * `intervalMs`, skipped while the previous one still runs. Its timer does not
 * keep the process alive, and a failed sweep is logged and tried again at the
 * next tick. Other periodic work (the usage roll-up) runs on it too, named
 * by `what` in its log line; a long run stops early when its signal aborts.
 */
export function createSweeper(sweepNow: (signal: AbortSignal) => Promise<unknown>, intervalMs: number, logger: Logger, what = "sweep"): Sweeper {
  let timer: NodeJS.Timeout | undefined;
  let sweeping: Promise<void> | undefined;
  let stopping = new AbortController();
  return {
    start() {
      if (timer) return;
      stopping = new AbortController();
      const { signal } = stopping;
      timer = setInterval(() => {
        if (sweeping) return;
        sweeping = sweepNow(signal)
          .then(() => undefined, (err: unknown) => logger.warn(`${what} failed`, { err }))
          .finally(() => {
            sweeping = undefined;
          });
      }, intervalMs);
      timer.unref();
    },
    async stop() {
      if (timer) clearInterval(timer);
      timer = undefined;
      stopping.abort();
      await sweeping;
    },
  };
}
