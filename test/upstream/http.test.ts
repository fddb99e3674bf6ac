import { getEventListeners } from "node:events";
import { afterEach, expect, it } from "vitest";
import { postWithRetry, UpstreamError } from "../../src/upstream/http.js";
import { deferred, logprobsReply, startFakeLlm, type FakeLlm } from "../support/fake-llm.js";

/**
 * The one HTTP wrapper of upstream calls, against a real local server
 * speaking the chat completions protocol: every attempt ends with its timer
 * cleared and its listener on the caller's signal removed, however it ends.
 * A decision makes one attempt per question, so a leak here grows with
 * every call the process serves.
 */
let fake: FakeLlm | undefined;
afterEach(async () => {
  await fake?.close();
  fake = undefined;
});

const call = (url: string) => ({ url: `${url}/v1/chat/completions`, headers: { authorization: "Bearer test" }, body: JSON.stringify({ model: "m", messages: [] }) });
const options = (signal: AbortSignal, attemptTimeoutMs = 60_000) => ({ signal, deadlineMs: Date.now() + 60_000, attemptTimeoutMs, maxRetries: 0 });
/** Timers this process holds now: an attempt that forgot its own would leave one behind for a minute. */
const timers = () => process.getActiveResourcesInfo().filter((kind) => kind === "Timeout").length;

it("answered calls leave no listener on the caller's signal and no timer behind", async () => {
  fake = await startFakeLlm(() => logprobsReply({ yes: 0.9, no: 0.1 }));
  const caller = new AbortController();
  const before = timers();
  for (let i = 0; i < 5; i++) {
    const response = await postWithRetry(call(fake.url), options(caller.signal));
    expect(response).toMatchObject({ status: 200, attempts: 1 });
    expect(JSON.parse(response.text)).toMatchObject({ object: "chat.completion" });
  }
  expect(getEventListeners(caller.signal, "abort")).toHaveLength(0);
  expect(timers()).toBeLessThanOrEqual(before);
});

it("an attempt that outlives its timeout ends as a timeout, cleaned up", async () => {
  const never = deferred();
  fake = await startFakeLlm(() => ({ hold: never.promise }));
  const caller = new AbortController();
  const failure = await postWithRetry(call(fake.url), options(caller.signal, 50)).catch((err: unknown) => err);
  expect(failure).toBeInstanceOf(UpstreamError);
  expect(failure).toMatchObject({ kind: "timeout", attempts: 1 });
  expect(getEventListeners(caller.signal, "abort")).toHaveLength(0);
  never.resolve();
});

it("a caller that goes away mid-call ends it as aborted, and the upstream sees the request dropped", async () => {
  const never = deferred();
  fake = await startFakeLlm(() => ({ hold: never.promise }));
  const dropped = new Promise<void>((resolve) => (fake!.onRequestClosed = resolve));
  const caller = new AbortController();
  const pending = postWithRetry(call(fake.url), options(caller.signal)).catch((err: unknown) => err);
  await fake.received(1);
  caller.abort();
  expect(await pending).toMatchObject({ kind: "aborted", attempts: 1 });
  await dropped;
  never.resolve();
});

it("a caller already gone sends nothing", async () => {
  fake = await startFakeLlm(() => logprobsReply({ yes: 1 }));
  const caller = new AbortController();
  caller.abort();
  await expect(postWithRetry(call(fake.url), options(caller.signal))).rejects.toMatchObject({ kind: "aborted", attempts: 0 });
  expect(fake.requests).toHaveLength(0);
});

it("a caller that goes away just as its attempt gets a slot sends nothing", async () => {
  fake = await startFakeLlm(() => logprobsReply({ yes: 1 }));
  const caller = new AbortController();
  let released = 0;
  // The slot is granted in the same turn as the caller leaves: the attempt starts with its signal already aborted.
  const slot = async () => {
    caller.abort();
    return () => void (released += 1);
  };
  await expect(postWithRetry(call(fake.url), { ...options(caller.signal), slot })).rejects.toMatchObject({ kind: "aborted", attempts: 1 });
  expect(fake.requests).toHaveLength(0);
  expect(released).toBe(1);
});
