import pg from "pg";
import { afterEach, describe, expect, it, vi } from "vitest";
import { StatementTimeoutError } from "../../src/db/pooled-statement.js";
import { createBatcher } from "../../src/db/statement-batcher.js";

/**
 * How createBatcher groups items and splits failures, with `run` (its seam
 * to the database) answering from the test: each batch it receives waits on
 * a promise the test settles, so what is out and what queues is exact.
 * test/metering/ledger.test.ts runs it against PostgreSQL's own errors.
 */
function recordingRun() {
  const batches: Array<{ items: number[]; answer(results: string[]): void; fail(err: unknown): void }> = [];
  const run = (items: number[]) =>
    new Promise<string[]>((resolve, reject) => {
      batches.push({ items, answer: resolve, fail: reject });
    });
  return { batches, run };
}

/** An error as pg reports one the server sent for the statement (an ErrorResponse). */
function refusedByDatabase(): pg.DatabaseError {
  const err = new pg.DatabaseError("new row violates check constraint", 100, "error");
  err.code = "23514";
  return err;
}

const settledTick = () => new Promise((resolve) => setImmediate(resolve));

describe("createBatcher", () => {
  it("sends a lone item at once, then groups what queues behind the batches out, in order, up to maxBatch", async () => {
    const { batches, run } = recordingRun();
    const submit = createBatcher({ run, maxBatch: 3, maxInFlight: 2, stallMs: 60_000 });
    const answers = [1, 2, 3, 4, 5, 6, 7].map((item) => submit(item));
    expect(batches.map((b) => b.items)).toEqual([[1], [2]]);

    batches[1]!.answer(["two"]);
    await settledTick();
    expect(batches.map((b) => b.items)).toEqual([[1], [2], [3, 4, 5]]);

    batches[0]!.answer(["one"]);
    await settledTick();
    expect(batches.map((b) => b.items)).toEqual([[1], [2], [3, 4, 5], [6, 7]]);
    batches[2]!.answer(["three", "four", "five"]);
    batches[3]!.answer(["six", "seven"]);
    expect(await Promise.all(answers)).toEqual(["one", "two", "three", "four", "five", "six", "seven"]);
  });

  it("after a batch the database refused, sends each item again alone: only the item refused alone fails", async () => {
    const { batches, run } = recordingRun();
    const submit = createBatcher({ run, maxBatch: 10, maxInFlight: 1, stallMs: 60_000 });
    const answers = [1, 2, 3, 4].map((item) => submit(item).catch((err: unknown) => err));
    batches[0]!.answer(["one"]);
    await settledTick();
    batches[1]!.fail(refusedByDatabase());
    await settledTick();
    expect(batches.map((b) => b.items)).toEqual([[1], [2, 3, 4], [2], [3], [4]]);
    batches[2]!.answer(["two"]);
    const refusedAlone = refusedByDatabase();
    batches[3]!.fail(refusedAlone);
    batches[4]!.answer(["four"]);
    expect(await Promise.all(answers)).toEqual(["one", "two", refusedAlone, "four"]);
  });

  it("holds its slot while the items of a refused batch go alone, so nothing overtakes them", async () => {
    const { batches, run } = recordingRun();
    const submit = createBatcher({ run, maxBatch: 10, maxInFlight: 1, stallMs: 60_000 });
    void [1, 2, 3].map((item) => submit(item).catch(() => undefined));
    batches[0]!.answer(["one"]);
    await settledTick();
    batches[1]!.fail(refusedByDatabase());
    await settledTick();
    void submit(4);
    await settledTick();
    expect(batches.map((b) => b.items)).toEqual([[1], [2, 3], [2], [3]]);
    batches[2]!.answer(["two"]);
    batches[3]!.answer(["three"]);
    await settledTick();
    expect(batches.map((b) => b.items)).toEqual([[1], [2, 3], [2], [3], [4]]);
  });

  it.each([
    ["a reply past its deadline", new StatementTimeoutError(1_000)],
    ["a lost connection", Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" })],
  ])("gives every item of a batch whose outcome is unknown (%s) that failure, and sends nothing again", async (_, failure) => {
    const { batches, run } = recordingRun();
    const submit = createBatcher({ run, maxBatch: 10, maxInFlight: 1, stallMs: 60_000 });
    const answers = [1, 2, 3].map((item) => submit(item).catch((err: unknown) => err));
    batches[0]!.answer(["one"]);
    await settledTick();
    batches[1]!.fail(failure);
    expect(await Promise.all(answers)).toEqual(["one", failure, failure]);
    expect(batches.map((b) => b.items)).toEqual([[1], [2, 3]]);
  });

  describe("a batch that does not answer", () => {
    afterEach(() => {
      vi.useRealTimers();
    });

    it("gives its slot up after stallMs, so the items behind it go; the slot is not given back twice when it answers", async () => {
      vi.useFakeTimers();
      const { batches, run } = recordingRun();
      const submit = createBatcher({ run, maxBatch: 10, maxInFlight: 1, stallMs: 50 });
      const answers = [1, 2, 3].map((item) => submit(item));
      vi.advanceTimersByTime(49.7);
      expect(batches.map((b) => b.items)).toEqual([[1]]);
      vi.advanceTimersByTime(0.6);
      expect(batches.map((b) => b.items)).toEqual([[1], [2, 3]]);

      batches[0]!.answer(["one"]);
      await vi.advanceTimersByTimeAsync(0);
      void submit(4);
      // The second batch holds the only slot again: the stalled one answering late did not free a second.
      expect(batches.map((b) => b.items)).toEqual([[1], [2, 3]]);
      batches[1]!.answer(["two", "three"]);
      await vi.advanceTimersByTimeAsync(0);
      expect(batches.map((b) => b.items)).toEqual([[1], [2, 3], [4]]);
      expect(await Promise.all(answers)).toEqual(["one", "two", "three"]);
    });
  });

  it("does not send a lone item the database refused again", async () => {
    const { batches, run } = recordingRun();
    const submit = createBatcher({ run, maxBatch: 10, maxInFlight: 2, stallMs: 60_000 });
    const refused = refusedByDatabase();
    const answer = submit(1).catch((err: unknown) => err);
    batches[0]!.fail(refused);
    expect(await answer).toBe(refused);
    expect(batches).toHaveLength(1);
  });
});
