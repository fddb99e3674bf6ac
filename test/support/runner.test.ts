import { describe, expect, it } from "vitest";
import { createChecks } from "./runner.js";

describe("the runners' checks (test/support/runner.ts)", () => {
  it("prints each check, the time taken and the tally; a passing check's long detail only under no limit", () => {
    const checks = createChecks(() => 12_345);
    expect(checks.check("first", true, "short")).toBe(true);
    expect(checks.check("second", false, "why it failed")).toBe(false);
    checks.check("third", true, "x".repeat(100));
    expect(checks.report(10_000, 80)).toBe("\nok   first: short\nFAIL second: why it failed\nok   third\ntook 2.3 s\n2 passed, 1 failed\n");
    expect(checks.report(10_000)).toContain(`ok   third: ${"x".repeat(100)}\n`);
  });

  it("fails the run when a check failed or none ran", () => {
    const none = createChecks();
    expect(none.exitCode()).toBe(1);
    const passing = createChecks();
    passing.check("a", true);
    expect(passing.exitCode()).toBe(0);
    passing.check("b", false);
    expect(passing.exitCode()).toBe(1);
  });
});
