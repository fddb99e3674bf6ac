import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { createPasswordWork } from "../../src/accounts/password-work.js";
import { passwordStrengthProblem } from "../../src/accounts/password-strength.js";
import { passwordLength, passwordProblem } from "../../src/accounts/passwords.js";
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
    expect(work.load).toEqual({ running: 2, waiting: 1 });
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
    expect(work.load).toEqual({ running: 2, waiting: 0 });
    gates[2]!.open();
    gates[0]!.open();
    expect(await Promise.all(runs)).toEqual([0, 1, 2]);
    expect(order.slice(0, 1)).toEqual([1]);
    expect(work.load).toEqual({ running: 0, waiting: 0 });
  });

  it("gives each client at most `perClient` places, running or waiting, and frees them when done or failed", async () => {
    const work = createPasswordWork({ concurrent: 1, queued: 10, perClient: 2 });
    const a = [gate(), gate()];
    const runs = a.map((g) => work.run("10.0.0.1", g.work));
    expect(reasonOf(await work.run("10.0.0.1", async () => "x").catch((err: unknown) => err))).toBe("PASSWORD_CHECKS_BUSY");
    const other = gate();
    const otherRun = work.run("10.0.0.2", other.work);
    expect(work.load).toEqual({ running: 1, waiting: 2 });
    a[0]!.open();
    await runs[0];
    const failing = work.run("10.0.0.1", () => Promise.reject(new Error("scrypt failed")));
    a[1]!.open();
    other.open();
    await Promise.all([runs[1], otherRun]);
    await expect(failing).rejects.toThrow("scrypt failed");
    // Both places of the first client are free again.
    expect(await Promise.all([work.run("10.0.0.1", async () => 1), work.run("10.0.0.1", async () => 2)])).toEqual([1, 2]);
    expect(work.load).toEqual({ running: 0, waiting: 0 });
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
