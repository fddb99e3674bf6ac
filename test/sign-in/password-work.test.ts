import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { createPasswordWork } from "../../src/sign-in/password-work.js";
import { passwordStrengthProblem } from "../../src/sign-in/password-strength.js";
import { passwordLength, passwordProblem } from "../../src/sign-in/passwords.js";
import { ErrorDetailSchema } from "../../src/gen/typesafe/error/v1/error_pb.js";

/** A piece of work that ends when the test says so. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, work: () => opened.then(() => "done") };
}

function reasonOf(err: unknown): string | undefined {
  return err instanceof ConnectError ? err.findDetails(ErrorDetailSchema)[0]?.reason : undefined;
}

describe("the password work queue", () => {
  it("runs `concurrent` at once, queues `queued` more in order, and refuses the rest at once with a retry delay", async () => {
    const work = createPasswordWork({ concurrent: 2, queued: 1, perClient: 10 });
    const gates = [gate(), gate(), gate()];
    const order: number[] = [];
    const runs = gates.map((g, i) => work.run(`client ${i}`, async () => (await g.work(), order.push(i), i)));
    expect(work.load).toEqual({ running: 2, waiting: 1, clients: 3 });
    const delays: number[] = [];
    const refused = await work.run("client 9", async () => "never", (s) => delays.push(s)).catch((err: unknown) => err);
    expect(reasonOf(refused)).toBe("PASSWORD_CHECKS_BUSY");
    expect((refused as ConnectError).code).toBe(Code.ResourceExhausted);
    expect(delays).toHaveLength(1);
    expect(delays[0]).toBeGreaterThanOrEqual(1);
    expect((refused as ConnectError).findDetails(ErrorDetailSchema)[0]?.metadata["retry_after_seconds"]).toBe(String(delays[0]));
    gates[1]!.open();
    await runs[1];
    // The turn went to the one waiting, not to a newcomer.
    expect(work.load).toEqual({ running: 2, waiting: 0, clients: 2 });
    gates[2]!.open();
    gates[0]!.open();
    expect(await Promise.all(runs)).toEqual([0, 1, 2]);
    expect(order.slice(0, 1)).toEqual([1]);
    expect(work.load).toEqual({ running: 0, waiting: 0, clients: 0 });
  });

  it("gives each client at most `perClient` places, running or waiting, and frees them when done or failed", async () => {
    const work = createPasswordWork({ concurrent: 1, queued: 10, perClient: 2 });
    const a = [gate(), gate()];
    const runs = a.map((g) => work.run("10.0.0.1", g.work));
    expect(reasonOf(await work.run("10.0.0.1", async () => "x").catch((err: unknown) => err))).toBe("PASSWORD_CHECKS_BUSY");
    const other = gate();
    const otherRun = work.run("10.0.0.2", other.work);
    expect(work.load).toEqual({ running: 1, waiting: 2, clients: 2 });
    a[0]!.open();
    await runs[0];
    const failing = work.run("10.0.0.1", () => Promise.reject(new Error("scrypt failed")));
    a[1]!.open();
    other.open();
    await Promise.all([runs[1], otherRun]);
    await expect(failing).rejects.toThrow("scrypt failed");
    // Both places of the first client are free again.
    expect(await Promise.all([work.run("10.0.0.1", async () => 1), work.run("10.0.0.1", async () => 2)])).toEqual([1, 2]);
    expect(work.load).toEqual({ running: 0, waiting: 0, clients: 0 });
  });
});

/** The refusal a full queue or a client's full share gives: its message, its metadata's delay, and the delay `onRefused` got. */
async function refusedRun(work: ReturnType<typeof createPasswordWork>, client: string) {
  const delays: number[] = [];
  const err = await work.run(client, async () => "never", (s) => delays.push(s)).then(
    () => {
      throw new Error("the work ran");
    },
    (e: unknown) => e as ConnectError,
  );
  const detail = err.findDetails(ErrorDetailSchema)[0];
  return { reason: detail?.reason, message: err.rawMessage, metadata: detail?.metadata, delays };
}

/** Starts `count` gated pieces of work, one client each, and returns what ends them. */
function occupy(work: ReturnType<typeof createPasswordWork>, count: number, label = "busy") {
  const gates = Array.from({ length: count }, () => gate());
  const runs = gates.map((g, i) => work.run(`${label} ${i}`, g.work));
  return async () => {
    for (const g of gates) g.open();
    await Promise.all(runs);
  };
}

describe("the retry delay: the work ahead, at the average hash time, spread over the concurrent turns", () => {
  it("before any hash is timed, each counts as 0.3 s: 11 ahead on one turn is 3.3 s, told as 4 s everywhere", async () => {
    const work = createPasswordWork({ concurrent: 1, queued: 10, perClient: 100 });
    const release = occupy(work, 11);
    expect(work.load).toEqual({ running: 1, waiting: 10, clients: 11 });
    expect(await refusedRun(work, "late")).toEqual({
      reason: "PASSWORD_CHECKS_BUSY",
      message: "too many password checks waiting: try again in 4 s",
      metadata: { retry_after_seconds: "4" },
      delays: [4],
    });
    await release();
  });

  it("more turns shorten it: 20 ahead on four turns is 1.5 s, told as 2 s", async () => {
    const work = createPasswordWork({ concurrent: 4, queued: 16, perClient: 100 });
    const release = occupy(work, 20);
    const refused = await refusedRun(work, "late");
    expect([refused.message, refused.delays]).toEqual(["too many password checks waiting: try again in 2 s", [2]]);
    await release();
  });

  it("a client past its share is told so, with the same delay: 1 s for one hash ahead, 2 s for four", async () => {
    const work = createPasswordWork({ concurrent: 1, queued: 5, perClient: 1 });
    const mine = gate();
    const running = work.run("10.0.0.1", mine.work);
    expect(await refusedRun(work, "10.0.0.1")).toEqual({
      reason: "PASSWORD_CHECKS_BUSY",
      message: "too many password checks from this client at once: try again in 1 s",
      metadata: { retry_after_seconds: "1" },
      delays: [1],
    });
    const release = occupy(work, 3, "other");
    // 4 × 0.3 s = 1.2 s, rounded up.
    expect((await refusedRun(work, "10.0.0.1")).message).toBe("too many password checks from this client at once: try again in 2 s");
    mine.open();
    await Promise.all([running, release()]);
  });

  it("each timed hash moves the average a fifth of the way to its own time", async () => {
    // A clock of the test's own: each hash takes exactly as long as it says.
    let clock = 5_000;
    const work = createPasswordWork({ concurrent: 1, queued: 4, perClient: 100 }, () => clock);
    const hashTaking = (ms: number) => async () => {
      clock += ms;
    };
    await work.run("a", hashTaking(2_000));
    // 0.8 × 300 + 0.2 × 2000 = 640 ms; 5 ahead × 640 ms = 3.2 s.
    let release = occupy(work, 5);
    expect((await refusedRun(work, "late")).delays).toEqual([4]);
    await release();
    // The five gated hashes took no time on this clock: 640 × 0.8^5 = 209.7 ms.
    await work.run("a", hashTaking(100));
    // 0.8 × 209.7 + 0.2 × 100 = 187.8 ms; 5 ahead = 0.94 s.
    release = occupy(work, 5);
    expect((await refusedRun(work, "late")).delays).toEqual([1]);
    await release();
    for (let i = 0; i < 3; i += 1) await work.run("a", hashTaking(4_000));
    // 187.8 × 0.8^5 = 61.5 ms, then three of 4 s: 61.5 × 0.512 + 4000 × 0.488 = 1983.5 ms; 5 ahead = 9.9 s.
    release = occupy(work, 5);
    expect((await refusedRun(work, "late")).delays).toEqual([10]);
    await release();
  });
});

describe("turns", () => {
  it("with no queue (queued: 0), `concurrent` run and the next is refused at once; a freed turn takes a newcomer", async () => {
    const work = createPasswordWork({ concurrent: 1, queued: 0, perClient: 10 });
    const first = gate();
    const running = work.run("a", first.work);
    expect(work.load).toEqual({ running: 1, waiting: 0, clients: 1 });
    expect((await refusedRun(work, "b")).message).toBe("too many password checks waiting: try again in 1 s");
    first.open();
    expect(await running).toBe("done");
    // The freed turn goes to a newcomer; timed by the real clock, the quick first hash keeps the delay at 1 s.
    const second = gate();
    const next = work.run("b", second.work);
    expect((await refusedRun(work, "c")).message).toBe("too many password checks waiting: try again in 1 s");
    second.open();
    expect(await next).toBe("done");
  });

  it("a finished turn goes to the oldest waiter, and one arriving meanwhile queues behind the rest", async () => {
    const work = createPasswordWork({ concurrent: 1, queued: 3, perClient: 10 });
    const started: string[] = [];
    const gates = new Map<string, ReturnType<typeof gate>>();
    const start = (name: string) => {
      const g = gate();
      gates.set(name, g);
      return work.run(name, () => (started.push(name), g.work()));
    };
    const runs = ["a", "b", "c", "d"].map(start);
    expect(started).toEqual(["a"]);
    gates.get("a")!.open();
    await runs[0];
    runs.push(start("e"));
    expect(work.load).toEqual({ running: 1, waiting: 3, clients: 4 });
    for (const name of ["b", "c", "d", "e"]) {
      await expect.poll(() => started.at(-1)).toBe(name);
      expect(work.load.running).toBe(1);
      gates.get(name)!.open();
    }
    await Promise.all(runs);
    expect(started).toEqual(["a", "b", "c", "d", "e"]);
    expect(work.load).toEqual({ running: 0, waiting: 0, clients: 0 });
  });

  it("a client's place is given back one at a time: with two in flight and one done, it has one place left, not two", async () => {
    const work = createPasswordWork({ concurrent: 1, queued: 10, perClient: 2 });
    const [one, two] = [gate(), gate()];
    const runs = [work.run("10.0.0.1", one.work), work.run("10.0.0.1", two.work)];
    one.open();
    await runs[0];
    expect(work.load).toEqual({ running: 1, waiting: 0, clients: 1 });
    const three = gate();
    runs.push(work.run("10.0.0.1", three.work));
    expect((await refusedRun(work, "10.0.0.1")).reason).toBe("PASSWORD_CHECKS_BUSY");
    two.open();
    three.open();
    await Promise.all(runs);
    // No entry is kept for a client with nothing in flight.
    expect(work.load).toEqual({ running: 0, waiting: 0, clients: 0 });
  });
});

describe("password rules count one way", () => {
  it.each([
    ["😀".repeat(12), 12],
    ["😀".repeat(256), 256],
    ["cafe\u0301 au lait", 12],
    ["x".repeat(12), 12],
  ])("%j is %i characters, whether set or used to sign in", (password, chars) => {
    expect(passwordLength(password)).toBe(chars);
  });

  it("200 emoji (400 UTF-16 units) pass the length rule, as they pass sign-in's", () => {
    expect(passwordProblem("😀".repeat(200))).toBeUndefined();
    expect(passwordProblem("😀".repeat(257))).toBe("at most 256 characters");
  });
});

describe("password strength (zxcvbn-ts)", () => {
  it.each([
    ["aaaaaaaaaaaa"],
    [" ".repeat(12)],
    ["password1234"],
    ["qwertyuiop12"],
    ["123456789012"],
    ["abcdefghijkl"],
    ["x".repeat(256)],
  ])("%j is too easy to guess", (password) => {
    expect(passwordStrengthProblem(password)).toMatch(/^too easy to guess/);
  });

  it.each([["a long enough password"], ["correct horse battery staple"], ["Tr0ub4dor&3xy"]])("%j is strong enough", (password) => {
    expect(passwordStrengthProblem(password)).toBeUndefined();
  });

  it("the member's own email counts as a known word", () => {
    expect(passwordStrengthProblem("dragonfly1987!")).toBeUndefined();
    expect(passwordStrengthProblem("dragonfly1987!", ["dragonfly1987@example.com"])).toMatch(/^too easy/);
  });
});
