import { describe, expect, it } from "vitest";
import { createFairSemaphore } from "../../src/upstream/fair-semaphore.js";

const live = () => new AbortController().signal;

/** Records the order in which queued acquisitions are granted. */
function recorder() {
  const granted: string[] = [];
  const releases = new Map<string, () => void>();
  const track = (name: string, acquired: Promise<(() => void) | undefined>) =>
    acquired.then((release) => {
      if (release) {
        granted.push(name);
        releases.set(name, release);
      }
      return release;
    });
  return { granted, releases, track };
}

describe("createFairSemaphore", () => {
  it("grants up to the limit at once and queues the rest", async () => {
    const slots = createFairSemaphore(2);
    const a = {};
    const first = await slots.acquire(a, live());
    const second = await slots.acquire(a, live());
    expect(first).toBeTypeOf("function");
    expect(second).toBeTypeOf("function");
    let thirdGranted = false;
    const third = slots.acquire(a, live()).then((release) => {
      thirdGranted = true;
      return release;
    });
    await Promise.resolve();
    expect(thirdGranted).toBe(false);
    expect(slots.waiting()).toBe(1);
    first!();
    expect(await third).toBeTypeOf("function");
    expect(slots.waiting()).toBe(0);
  });

  it("hands a freed slot to the party served longest ago, first come first served within a party", async () => {
    const slots = createFairSemaphore(1);
    const big = {};
    const small = {};
    const { granted, releases, track } = recorder();
    await track("big-0", slots.acquire(big, live()));
    const queued = [
      track("big-1", slots.acquire(big, live())),
      track("big-2", slots.acquire(big, live())),
      track("big-3", slots.acquire(big, live())),
      track("small-1", slots.acquire(small, live())),
    ];
    expect(slots.waiting()).toBe(4);
    // Each release frees the slot for the next grant; the small party, never served, goes before big's second call.
    for (let i = 0; i < queued.length; i++) {
      releases.get(granted.at(-1)!)!();
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
    await Promise.all(queued);
    expect(granted).toEqual(["big-0", "small-1", "big-1", "big-2", "big-3"]);
  });

  it("alternates between two parties that both keep calls waiting", async () => {
    const slots = createFairSemaphore(1);
    const a = {};
    const b = {};
    const { granted, releases, track } = recorder();
    await track("a-0", slots.acquire(a, live()));
    const queued = [
      track("a-1", slots.acquire(a, live())),
      track("a-2", slots.acquire(a, live())),
      track("b-1", slots.acquire(b, live())),
      track("b-2", slots.acquire(b, live())),
    ];
    for (let i = 0; i < queued.length; i++) {
      releases.get(granted.at(-1)!)!();
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
    await Promise.all(queued);
    expect(granted).toEqual(["a-0", "b-1", "a-1", "b-2", "a-2"]);
  });

  it("a waiter whose signal aborts resolves undefined, leaves the queue and takes no slot", async () => {
    const slots = createFairSemaphore(1);
    const party = {};
    const release = await slots.acquire(party, live());
    const controller = new AbortController();
    const abandoned = slots.acquire(party, controller.signal);
    const next = slots.acquire({}, live());
    expect(slots.waiting()).toBe(2);
    controller.abort();
    expect(await abandoned).toBeUndefined();
    expect(slots.waiting()).toBe(1);
    release!();
    expect(await next).toBeTypeOf("function");
    expect(slots.waiting()).toBe(0);
  });

  it("an already aborted signal gets undefined without taking a slot", async () => {
    const slots = createFairSemaphore(1);
    const controller = new AbortController();
    controller.abort();
    expect(await slots.acquire({}, controller.signal)).toBeUndefined();
    expect(await slots.acquire({}, live())).toBeTypeOf("function");
  });

  it("releasing twice frees one slot, not two", async () => {
    const slots = createFairSemaphore(1);
    const party = {};
    const release = await slots.acquire(party, live());
    const second = slots.acquire(party, live());
    const third = slots.acquire(party, live());
    release!();
    release!();
    const secondRelease = await second;
    expect(secondRelease).toBeTypeOf("function");
    let thirdGranted = false;
    void third.then(() => (thirdGranted = true));
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(thirdGranted).toBe(false);
    expect(slots.waiting()).toBe(1);
    secondRelease!();
    expect(await third).toBeTypeOf("function");
  });
});
