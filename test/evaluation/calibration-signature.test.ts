import { describe, expect, it } from "vitest";
import { signatureDigest, signatureMismatch, signatureOf } from "../../src/evaluation/calibration-signature.js";
import type { CalibrationSignature } from "../../src/evaluation/calibration-store.js";

const base: CalibrationSignature = { type: "choice", instructions: "Which team?", labels: ["billing", "infra"], promptVersion: "p1", model: "m", upstream: "u" };

describe("signatureMismatch", () => {
  it.each<[string, Partial<CalibrationSignature>, string | undefined]>([
    ["the same question", {}, undefined],
    ["another type", { type: "score" }, "type (the calibration is for choice)"],
    ["other instructions (one space more)", { instructions: "Which team? " }, "instructions"],
    ["another option", { labels: ["billing", "infra", "sales"] }, "options"],
    ["the options in another order", { labels: ["infra", "billing"] }, "options"],
    ["another prompt version", { promptVersion: "p2" }, "prompt version (the calibration is for p1)"],
    ["another model name", { model: "m2" }, "model"],
    ["another upstream", { upstream: "u2" }, "upstream model"],
  ])("%s → %s", (_name, change, expected) => {
    const question = { ...base, ...change };
    expect(signatureMismatch(base, question)).toBe(expected);
    expect(signatureDigest(question) === signatureDigest(base)).toBe(expected === undefined);
  });

  it("a score question's labels are named labels", () => {
    const score = { ...base, type: "score" as const, labels: ["low", "high"] };
    expect(signatureMismatch(score, { ...score, labels: ["low", "mid", "high"] })).toBe("labels");
  });
});

describe("signatureOf", () => {
  it("reads the labels of each type and what the service asks with", () => {
    const asked = { promptVersion: "p1", model: "m", upstream: "u" };
    expect(signatureOf({ key: "k", type: "noul", instructions: "?" }, asked)).toEqual({ type: "noul", instructions: "?", labels: [], ...asked });
    expect(signatureOf({ key: "k", type: "choice", instructions: "?", options: ["a", "b"] }, asked).labels).toEqual(["a", "b"]);
    expect(signatureOf({ key: "k", type: "score", instructions: "?", labels: ["lo", "hi"] }, asked).labels).toEqual(["lo", "hi"]);
  });

  it("the digest is sha256 of the canonical JSON array", () => {
    // echo -n '["noul","?",[],"p1","m","u"]' | sha256sum
    expect(signatureDigest({ type: "noul", instructions: "?", labels: [], promptVersion: "p1", model: "m", upstream: "u" })).toBe(
      "73d48a55e2eb97a00046a318fa6fe479d0ecb5037e92f4fc12140a70d2ea5306",
    );
  });
});
