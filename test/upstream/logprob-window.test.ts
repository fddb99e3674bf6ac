import { describe, expect, it } from "vitest";
import { isReasoningOpener, mostProbable } from "../../src/upstream/logprob-window.js";

const w = (entries: Record<string, number>) => Object.entries(entries).map(([token, p]) => ({ token, logprob: Math.log(p) }));

describe("token window", () => {
  it("mostProbable finds the most probable entry wherever it stands", () => {
    expect(mostProbable(w({ B: 0.2, A: 0.7, C: 0.1 }))?.token).toBe("A");
  });

  it("mostProbable keeps the first of equal entries", () => {
    const window = [{ token: "A", logprob: -0.5 }, { token: "B", logprob: -0.5 }, { token: "C", logprob: -2 }];
    expect(mostProbable(window)?.token).toBe("A");
    expect(mostProbable([])).toBeUndefined();
  });

  it.each([
    ["<think>", true],
    ["  <think>", true],
    ["</think>", true],
    ["<thinking>", true],
    ["<reasoning>", true],
    ["<|channel|>", true],
    [" <|start|>", true],
    ["x<think>", false],
    ["A <think>", false],
    ["<thinker", false],
    ["A<|", false],
    ["A", false],
  ])("isReasoningOpener(%j) is %s: anchored at the start, after spaces only", (token, expected) => {
    expect(isReasoningOpener(token)).toBe(expected);
  });

  it("isReasoningOpener(undefined) is false", () => {
    expect(isReasoningOpener(undefined)).toBe(false);
  });
});
