import { describe, expect, it } from "vitest";
import { REQUIRED_OPTIONS, USAGE } from "../../src/admin/commands.js";

/** The commands --help lists, with `a|b|c` forms spelled out one by one. */
function usageCommands(): string[] {
  const lines = USAGE.split("\n").filter((line) => /^ {2}[a-z]/.test(line));
  return lines.flatMap((line) => {
    const words = line.trim().split(" ").filter((word) => /^[a-z|-]+$/.test(word));
    const [group, verbs] = words;
    if (verbs === undefined || !/^[a-z]/.test(verbs)) return [group!];
    return verbs.split("|").map((verb) => `${group} ${verb}`);
  });
}

describe("the CLI's command table", () => {
  // A command missing from the table would be refused as unknown before the store is opened.
  it("holds every command --help lists, and no other", () => {
    const listed = usageCommands();
    expect(listed.length).toBeGreaterThan(25);
    expect([...new Set(listed)].sort()).toEqual(Object.keys(REQUIRED_OPTIONS).sort());
  });
});
