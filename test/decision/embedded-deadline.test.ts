import { describe, expect, it } from "vitest";
import { embeddedDeadline, plannedTokens } from "../../src/decision/embedded-deadline.js";
import { createModelPace } from "../../src/upstream/model-pace.js";

const base = { configuredMs: 60_000, maxWaitMs: 300_000, callerMs: undefined, queuedTokens: 0 };

describe("the deadline of a decision on the embedded model", () => {
  it.each([
    // Before any measurement, only the configured deadline is known.
    [{ ...base, ownTokens: 3_100, tokensPerSecond: undefined }, { run: true, timeoutMs: 60_000, estimateMs: undefined }],
    // A slow machine: 40 questions, about 3,100 tokens at 97 tokens/s, with the margin: 48 s, inside the deadline.
    [{ ...base, ownTokens: 3_100, tokensPerSecond: 97 }, { run: true, timeoutMs: 60_000, estimateMs: 47_939 }],
    // Behind two such calls it needs longer than the configured deadline: it gets that time.
    [{ ...base, ownTokens: 3_100, queuedTokens: 6_200, tokensPerSecond: 97 }, { run: true, timeoutMs: 143_815, estimateMs: 143_815 }],
    // Behind more than the longest wait allows: refused, with when the queue ahead has drained.
    [
      { ...base, ownTokens: 3_100, queuedTokens: 20_000, tokensPerSecond: 97 },
      { run: false, estimateMs: 357_217, limitMs: 300_000, limitedBy: "max_wait", retryAfterMs: 309_279 },
    ],
    // A call that alone needs more than the limit: waiting does not help, so no retry time.
    [{ ...base, ownTokens: 20_000, tokensPerSecond: 97 }, { run: false, estimateMs: 309_279, limitMs: 300_000, limitedBy: "max_wait", retryAfterMs: undefined }],
    // The caller's own deadline is shorter than the estimate: refused at once rather than cut.
    [
      { ...base, ownTokens: 3_100, callerMs: 30_000, tokensPerSecond: 97 },
      { run: false, estimateMs: 47_939, limitMs: 30_000, limitedBy: "caller_deadline", retryAfterMs: undefined },
    ],
    // A longest wait below the configured deadline never shortens it.
    [{ ...base, maxWaitMs: 1_000, ownTokens: 3_100, tokensPerSecond: 97 }, { run: true, timeoutMs: 60_000, estimateMs: 47_939 }],
  ])("%j → %j", (input, expected) => {
    expect(embeddedDeadline(input)).toEqual(expected);
  });
});

describe("the fewest tokens a call's questions need", () => {
  it.each([
    [[], 2, 0],
    [[[1, 2, 3, 4]], 2, 4],
    // A shared prefix of 3, once per sequence that may serve the questions, and each question's own tokens.
    [[[1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 2, 3, 7, 7, 7]], 2, 2 * 3 + 2 + 1 + 3],
    [[[1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 2, 3, 7, 7, 7]], 1, 3 + 2 + 1 + 3],
    [[[1, 2], [3, 4]], 2, 4],
    // One prompt a prefix of another.
    [[[1, 2], [1, 2, 3]], 4, 2 * 2 + 0 + 1],
  ])("%j on %i sequences → %i", (prompts, sequences, expected) => {
    expect(plannedTokens(prompts, sequences)).toBe(expected);
  });
});

describe("the model's pace", () => {
  it("measures tokens per busy second; evaluations side by side share the time they overlap", () => {
    let now = 0;
    const pace = createModelPace({ now: () => now });
    expect(pace.tokensPerSecond()).toBeUndefined();
    const a = pace.evaluating();
    now = 1_000;
    const b = pace.evaluating();
    now = 2_000;
    a(150);
    now = 3_000;
    b(150);
    // 300 tokens in 3 busy seconds, not in the 2 + 2 seconds each took.
    expect(pace.tokensPerSecond()).toBeCloseTo((150 * 0.8 + 150) / (2_000 * 0.8 + 1_000) * 1000, 9);
    // Idle time between evaluations is not busy time.
    now = 100_000;
    const c = pace.evaluating();
    now = 101_000;
    c(100);
    expect(pace.tokensPerSecond()).toBeCloseTo(((150 * 0.8 + 150) * 0.8 + 100) / ((2_000 * 0.8 + 1_000) * 0.8 + 1_000) * 1000, 9);
  });

  it("counts booked tokens until each call gives them back, once", () => {
    const pace = createModelPace();
    const first = pace.book(3_000);
    const second = pace.book(500);
    expect(pace.queuedTokens()).toBe(3_500);
    first();
    first();
    expect(pace.queuedTokens()).toBe(500);
    second();
    expect(pace.queuedTokens()).toBe(0);
  });
});
