import pg from "pg";

/** How createBatcher groups items. */
export interface BatcherOptions<Item, Result> {
  /** Runs one batch; resolves to one result per item, in the items' order. */
  run(items: Item[]): Promise<Result[]>;
  /** Items per statement at most. */
  maxBatch: number;
  /** Batches out at once at most: what a burst waits behind. */
  maxInFlight: number;
  /** A batch out this long stops counting against maxInFlight. */
  stallMs: number;
}

interface Queued<Item, Result> {
  item: Item;
  resolve(result: Result): void;
  reject(err: unknown): void;
}

/**
 * Groups the same statement of concurrent calls into one round trip, as a
 * database's group commit does: an item is sent at once while fewer than
 * `maxInFlight` batches are out, else it waits for one to come back and goes
 * with every item that queued meanwhile (up to `maxBatch`). A lone call pays
 * nothing; under load, one statement, one transaction and one WAL flush serve
 * many calls, which is what PostgreSQL's CPU goes to on a busy machine
 * (docs/performance.md). The fewer batches out, the larger each one; but a
 * batch out for `stallMs` (a lost reply waits for its deadline) gives its
 * slot up, so that one stuck statement never holds every call behind it.
 *
 * A batch is all or nothing, and its failure is each item's:
 * - an error the database reported for the statement means it rolled back,
 *   so each item is sent again alone and fails or succeeds on its own;
 * - any other failure (a lost connection, a reply past its deadline) leaves
 *   the outcome unknown, and every item's caller gets it, as it would alone.
 *
 * Returns a function that runs one item, batched with the items of concurrent calls.
 */
export function createBatcher<Item, Result>(options: BatcherOptions<Item, Result>): (item: Item) => Promise<Result> {
  const { run, maxBatch, maxInFlight, stallMs } = options;
  const queue: Queued<Item, Result>[] = [];
  let inFlight = 0;

  function sendWhileFree(): void {
    while (inFlight < maxInFlight && queue.length > 0) {
      const batch = queue.splice(0, maxBatch);
      inFlight++;
      let holdsSlot = true;
      const giveSlotUp = () => {
        if (!holdsSlot) return;
        holdsSlot = false;
        inFlight--;
        sendWhileFree();
      };
      const stalled = setTimeout(giveSlotUp, stallMs);
      void send(batch).finally(() => {
        clearTimeout(stalled);
        giveSlotUp();
      });
    }
  }

  async function send(batch: Queued<Item, Result>[]): Promise<void> {
    try {
      const results = await run(batch.map((queued) => queued.item));
      batch.forEach((queued, i) => queued.resolve(results[i]!));
    } catch (err) {
      if (batch.length > 1 && err instanceof pg.DatabaseError) {
        await Promise.all(batch.map((queued) => send([queued])));
      } else {
        for (const queued of batch) queued.reject(err);
      }
    }
  }

  return (item) =>
    new Promise<Result>((resolve, reject) => {
      queue.push({ item, resolve, reject });
      sendWhileFree();
    });
}
