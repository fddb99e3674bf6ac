import fs from "node:fs";
import { describe, expect, it } from "vitest";
import { ACTIVITY_KINDS } from "../../src/team/activity.js";

/**
 * The activity kinds are published as text (ActivityEvent.kind), so the
 * contract's comment is their only list for a client: it must name every kind
 * the service writes, and no other.
 */
describe("activity kinds", () => {
  it("are listed in ActivityEvent.kind's comment, exactly", () => {
    const proto = fs.readFileSync(new URL("../../proto/typesafe/account/v1/account_service.proto", import.meta.url), "utf8");
    const comment = /message ActivityEvent \{[\s\S]*?((?:\s*\/\/[^\n]*\n)+)\s*string kind = 2;/.exec(proto)?.[1] ?? "";
    const listed = [...comment.matchAll(/"([a-z_]+)"/g)].map((m) => m[1]);
    expect([...listed].sort()).toEqual([...ACTIVITY_KINDS].sort());
  });

  it("of evaluations are named in docs/evaluations.md", () => {
    const doc = fs.readFileSync(new URL("../../docs/evaluations.md", import.meta.url), "utf8");
    for (const kind of ACTIVITY_KINDS.filter((k) => k.startsWith("evaluation_") || k.startsWith("calibration_"))) expect(doc).toContain(`\`${kind}\``);
  });
});
