import { afterEach, beforeEach, expect, it, vi } from "vitest";
import { createLogger } from "../../src/logger.js";
import { createSweeper } from "../../src/metering/sweeper.js";

/** The sweeper's schedule on vitest's fake clock: ticks are advanced, never waited for. */
const interval = 1_000;
let lines: Array<Record<string, unknown>>;
const logger = () => createLogger("debug", {}, (line) => lines.push(JSON.parse(line) as Record<string, unknown>));

beforeEach(() => {
  lines = [];
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

function deferred() {
  let resolve!: (n: number) => void;
  let reject!: (err: Error) => void;
  const promise = new Promise<number>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

it("sweeps once an interval, and a second start adds no second schedule", async () => {
  const sweepNow = vi.fn(async () => 0);
  const sweeper = createSweeper(sweepNow, interval, logger());
  sweeper.start();
  sweeper.start();
  expect(sweepNow).not.toHaveBeenCalled();
  await vi.advanceTimersByTimeAsync(interval - 1);
  expect(sweepNow).toHaveBeenCalledTimes(0);
  await vi.advanceTimersByTimeAsync(1);
  expect(sweepNow).toHaveBeenCalledTimes(1);
  await vi.advanceTimersByTimeAsync(2 * interval);
  expect(sweepNow).toHaveBeenCalledTimes(3);
  await sweeper.stop();
});

it("skips a tick while the previous sweep still runs, and sweeps again at the tick after it ends", async () => {
  const first = deferred();
  const sweepNow = vi.fn().mockReturnValueOnce(first.promise).mockResolvedValue(0);
  const sweeper = createSweeper(sweepNow, interval, logger());
  sweeper.start();
  await vi.advanceTimersByTimeAsync(3 * interval);
  expect(sweepNow).toHaveBeenCalledTimes(1);
  first.resolve(2);
  await vi.advanceTimersByTimeAsync(interval);
  expect(sweepNow).toHaveBeenCalledTimes(2);
  await sweeper.stop();
});

it("logs a failed sweep and tries again at the next tick", async () => {
  const sweepNow = vi.fn().mockRejectedValueOnce(new Error("connection refused")).mockResolvedValue(0);
  const sweeper = createSweeper(sweepNow, interval, logger());
  sweeper.start();
  await vi.advanceTimersByTimeAsync(interval);
  expect(lines).toEqual([expect.objectContaining({ level: "warn", msg: "sweep failed", err: expect.objectContaining({ message: "connection refused" }) })]);
  await vi.advanceTimersByTimeAsync(interval);
  expect(sweepNow).toHaveBeenCalledTimes(2);
  expect(lines).toHaveLength(1);
  await sweeper.stop();
});

it("stop waits for the sweep in progress, and no sweep starts after it", async () => {
  const running = deferred();
  const sweepNow = vi.fn().mockReturnValueOnce(running.promise).mockResolvedValue(0);
  const sweeper = createSweeper(sweepNow, interval, logger());
  sweeper.start();
  await vi.advanceTimersByTimeAsync(interval);
  let stopped = false;
  const stopping = sweeper.stop().then(() => (stopped = true));
  await vi.advanceTimersByTimeAsync(0);
  expect(stopped).toBe(false);
  running.resolve(1);
  await stopping;
  expect(stopped).toBe(true);
  await vi.advanceTimersByTimeAsync(5 * interval);
  expect(sweepNow).toHaveBeenCalledTimes(1);
  // Started again after a stop, it schedules anew.
  sweeper.start();
  await vi.advanceTimersByTimeAsync(interval);
  expect(sweepNow).toHaveBeenCalledTimes(2);
  await sweeper.stop();
});

it("stop aborts the signal of the run in progress, names the work in its log line, and a new start gets a fresh signal", async () => {
  const signals: AbortSignal[] = [];
  const running = deferred();
  const sweepNow = vi.fn((signal: AbortSignal) => {
    signals.push(signal);
    return signals.length === 1 ? running.promise : Promise.reject(new Error("busy"));
  });
  const sweeper = createSweeper(sweepNow, interval, logger(), "usage roll-up");
  sweeper.start();
  await vi.advanceTimersByTimeAsync(interval);
  expect(signals[0]!.aborted).toBe(false);
  const stopping = sweeper.stop();
  expect(signals[0]!.aborted).toBe(true);
  running.resolve(0);
  await stopping;
  sweeper.start();
  await vi.advanceTimersByTimeAsync(interval);
  expect(signals[1]!.aborted).toBe(false);
  expect(lines).toEqual([expect.objectContaining({ level: "warn", msg: "usage roll-up failed" })]);
  await sweeper.stop();
});

it("does not keep the process alive", async () => {
  vi.useRealTimers();
  const before = process.getActiveResourcesInfo().filter((kind) => kind === "Timeout").length;
  const sweeper = createSweeper(async () => 0, 60_000, logger());
  sweeper.start();
  expect(process.getActiveResourcesInfo().filter((kind) => kind === "Timeout").length).toBe(before);
  await sweeper.stop();
});
