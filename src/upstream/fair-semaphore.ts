/**
 * A counting semaphore that is fair between parties: a freed slot goes to the
 * waiting party served longest ago (round-robin between parties; first come,
 * first served within one), so one caller with many calls cannot starve
 * another with few. A waiter gives up when its signal aborts.
 */
export interface FairSemaphore {
  /**
   * Resolves with the slot's release function (calling it twice releases
   * once), or with undefined when `signal` aborts first; never rejects.
   */
  acquire(party: object, signal: AbortSignal): Promise<(() => void) | undefined>;
  /** Calls waiting for a slot. */
  waiting(): number;
}

/** A fair semaphore of `limit` slots. */
export function createFairSemaphore(limit: number): FairSemaphore {
  let active = 0;
  let waiting = 0;
  let grants = 0;
  const queues = new Map<object, Array<() => void>>();
  const lastGrant = new WeakMap<object, number>();
  const take = (party: object) => {
    lastGrant.set(party, ++grants);
    active += 1;
    return once(release);
  };
  function release() {
    active -= 1;
    let next: object | undefined;
    for (const party of queues.keys()) {
      if (next === undefined || (lastGrant.get(party) ?? 0) < (lastGrant.get(next) ?? 0)) next = party;
    }
    if (next === undefined) return;
    const queue = queues.get(next)!;
    const grant = queue.shift()!;
    if (queue.length === 0) queues.delete(next);
    grant();
  }
  return {
    waiting: () => waiting,
    acquire(party, signal) {
      if (signal.aborted) return Promise.resolve(undefined);
      if (active < limit) return Promise.resolve(take(party));
      return new Promise((resolve) => {
        const grant = () => {
          waiting -= 1;
          signal.removeEventListener("abort", onAbort);
          resolve(take(party));
        };
        const onAbort = () => {
          const queue = queues.get(party);
          const index = queue?.indexOf(grant) ?? -1;
          if (index < 0) return;
          queue!.splice(index, 1);
          if (queue!.length === 0) queues.delete(party);
          waiting -= 1;
          resolve(undefined);
        };
        waiting += 1;
        const queue = queues.get(party);
        if (queue) queue.push(grant);
        else queues.set(party, [grant]);
        signal.addEventListener("abort", onAbort, { once: true });
      });
    },
  };
}

function once(fn: () => void): () => void {
  let done = false;
  return () => {
    if (done) return;
    done = true;
    fn();
  };
}
