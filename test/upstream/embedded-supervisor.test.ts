import { describe, expect, it } from "vitest";
import { DOWNLOAD_RETRY, downloadRetryDelayMs, retryAfterSeconds } from "../../src/upstream/embedded-supervisor.js";
import { waitHintMs } from "../../src/upstream/model-fetch.js";

describe("the waits between download tries", () => {
  it.each([
    // [failures so far, random draw, the server's hint, wait]
    [1, 0, undefined, 5_000],
    [1, 1, undefined, 10_000],
    [2, 0.5, undefined, 15_000],
    [3, 0, undefined, 20_000],
    [7, 1, undefined, 600_000],
    [30, 0, undefined, 300_000],
    // The server's hint wins when it is longer, and is capped at the longest wait.
    [1, 0, 40_000, 40_000],
    [4, 1, 40_000, 80_000],
    [1, 0, 3_600_000, 600_000],
  ])("after %i failures, drawn %f, asked %s: %i ms", (failures, random, hint, expected) => {
    expect(downloadRetryDelayMs(failures, random, hint)).toBe(expected);
  });

  it("never exceeds the longest wait", () => {
    expect(DOWNLOAD_RETRY.longestMs).toBe(600_000);
    for (let failures = 1; failures < 64; failures++) expect(downloadRetryDelayMs(failures, 1)).toBeLessThanOrEqual(DOWNLOAD_RETRY.longestMs);
  });
});

describe("Retry-After while the model is not ready", () => {
  it.each([
    [{ state: "fetching", percent: 12 }, 30],
    [{ state: "loading" }, 5],
    [{ state: "failed", reason: "r", summary: "s", nextTryInMs: 12_001 }, 13],
    [{ state: "failed", reason: "r", summary: "s", nextTryInMs: 0 }, 1],
    // A file that does not load waits for an operator: no time would be true.
    [{ state: "failed", reason: "r", summary: "s" }, undefined],
  ] as const)("%j → %s", (state, seconds) => {
    expect(retryAfterSeconds(state)).toBe(seconds);
  });
});

describe("the wait a refusing server asks for", () => {
  const now = Date.parse("2026-11-28T02:00:00Z");
  it.each([
    [{ "retry-after": "120" }, 120_000],
    [{ "retry-after": "Sat, 28 Nov 2026 02:01:30 GMT" }, 90_000],
    [{ "retry-after": "Sat, 28 Nov 2026 01:00:00 GMT" }, 0],
    // The Hub's 429: the reset of its fixed window (huggingface.co/docs/hub/rate-limits).
    [{ ratelimit: '"resolvers";r=0;t=55', "ratelimit-policy": '"fixed window";"resolvers";q=3000;w=300' }, 55_000],
    [{ "retry-after": "7", ratelimit: '"resolvers";r=0;t=55' }, 7_000],
    [{ "retry-after": "soon" }, undefined],
    [{}, undefined],
  ])("%j → %s", (headers, ms) => {
    expect(waitHintMs(headers, now)).toBe(ms);
  });
});
