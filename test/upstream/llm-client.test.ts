import { describe, expect, it, onTestFinished } from "vitest";
import type { LlmConfig } from "../../src/config.js";
import { createLogger } from "../../src/logger.js";
import { CAPABILITIES_TTL_MS, createLlmClient, PROBE_FAILURE_TTL_MS, REPROBE_AFTER_REJECTIONS, readUsage } from "../../src/upstream/llm-client.js";
import { LlmCallError, type CallOptions } from "../../src/upstream/model-call.js";
import {
  deferred,
  fakeLlmConfig,
  isProbe,
  logprobsReply,
  PROBE_OK,
  startFakeLlm,
  textReply,
  type FakeHandler,
} from "../support/fake-llm.js";
import { waitFor } from "../support/wait.js";

async function setup(handler: FakeHandler, overrides: Partial<LlmConfig> = {}) {
  const fake = await startFakeLlm(handler);
  onTestFinished(() => fake.close());
  const config = fakeLlmConfig(fake, { apiKey: "sk-upstream-secret", maxRetries: 2, ...overrides });
  return { fake, client: createLlmClient({ config, logger: createLogger("silent") }) };
}

const opts = (signal = new AbortController().signal, ms = 5_000): CallOptions => ({ signal, deadlineMs: Date.now() + ms });
const ask = { kind: "logprobs" as const, messages: [{ role: "user" as const, content: "Q" }] };

describe("capability probe", () => {
  it("probes once for concurrent callers and sends the exact logprobs request", async () => {
    const { fake, client } = await setup((r) => (isProbe(r.body) ? PROBE_OK : logprobsReply({ A: 0.7, B: 0.3 })));
    const [caps] = await Promise.all([client.capabilities(opts()), client.capabilities(opts()), client.complete(ask, opts())]);
    expect(caps).toEqual({
      logprobs: true,
      topLogprobs: 20,
      maxTokensField: "max_tokens",
      thinkingSwitch: true,
      reasoningEffort: "none",
      alwaysThinks: false,
      jsonSchema: false,
      sampling: true,
      systemRole: true,
    });
    expect(fake.requests.filter((r) => isProbe(r.body))).toHaveLength(1);
    const question = fake.questionRequests()[0]!;
    expect(question.path).toBe("/v1/chat/completions");
    expect(question.headers.authorization).toBe("Bearer sk-upstream-secret");
    expect(question.body).toEqual({
      model: "fake-model",
      messages: [{ role: "user", content: "Q" }],
      chat_template_kwargs: { enable_thinking: false },
      reasoning_effort: "none",
      max_tokens: 1,
      temperature: 1,
      top_p: 1,
      logprobs: true,
      top_logprobs: 20,
    });
  });

  it.each([
    {
      name: "drops the thinking switch a server rejects",
      reject: (body: Record<string, unknown>) => ("chat_template_kwargs" in body ? "Unrecognized request argument supplied: chat_template_kwargs" : undefined),
      expected: { logprobs: true, topLogprobs: 20, thinkingSwitch: false, maxTokensField: "max_tokens" },
    },
    {
      name: "switches to max_completion_tokens",
      reject: (body: Record<string, unknown>) =>
        "max_tokens" in body ? "Unsupported parameter: 'max_tokens'. Use 'max_completion_tokens' instead." : undefined,
      expected: { logprobs: true, topLogprobs: 20, thinkingSwitch: true, maxTokensField: "max_completion_tokens" },
    },
    {
      name: "lowers top_logprobs to 5",
      reject: (body: Record<string, unknown>) => (Number(body.top_logprobs) > 5 ? "top_logprobs must be less than or equal to 5" : undefined),
      expected: { logprobs: true, topLogprobs: 5, thinkingSwitch: true, maxTokensField: "max_tokens" },
    },
    {
      name: "turns logprobs off on a reasoning model",
      reject: (body: Record<string, unknown>) => (body.logprobs ? "logprobs are not supported with reasoning models" : undefined),
      expected: { logprobs: false, jsonSchema: true, thinkingSwitch: true },
    },
  ])("$name", async ({ reject, expected }) => {
    const { client } = await setup((r) => {
      const complaint = reject(r.body);
      if (complaint) return { status: 400, json: { error: { message: complaint, type: "invalid_request_error" } } };
      return r.body.logprobs ? PROBE_OK : textReply('{"yes": 1}');
    });
    expect(await client.capabilities(opts())).toMatchObject(expected);
  });

  it.each([
    { name: "content: []", logprobs: { content: [] } },
    { name: "logprobs: null", logprobs: null },
    { name: "a one-entry window", logprobs: { content: [{ token: "yes", logprob: 0, top_logprobs: [{ token: "yes", logprob: 0 }] }] } },
  ])("treats a 200 with $name as no logprobs", async ({ logprobs }) => {
    const { client } = await setup(() => textReply("yes", { logprobs }));
    expect(await client.capabilities(opts())).toMatchObject({ logprobs: false });
  });

  it("probes again after calls are refused in a row: an upstream swapped behind the same URL is noticed", async () => {
    let swapped = false;
    // After the swap, an OpenAI reasoning model answers every logprobs request with its 400 (aandrew-me/tgpt#333).
    const refusal = { status: 400, json: { error: { message: "Unsupported parameter: 'logprobs' is not supported with this model.", type: "invalid_request_error", param: "logprobs", code: "unsupported_parameter" } } };
    const { fake, client } = await setup((r) => (swapped && r.body.logprobs ? refusal : r.body.logprobs ? PROBE_OK : textReply('{"yes": 1}')));
    expect(await client.capabilities(opts())).toMatchObject({ logprobs: true });
    swapped = true;
    for (let i = 0; i < REPROBE_AFTER_REJECTIONS; i++) {
      await expect(client.complete(ask, opts())).rejects.toMatchObject({ code: "rejected", status: 400 });
      // Until the last refusal in a row, the cached capabilities stand.
      if (i < REPROBE_AFTER_REJECTIONS - 1) expect(fake.requests.filter((r) => isProbe(r.body))).toHaveLength(1);
    }
    expect(await client.capabilities(opts())).toMatchObject({ logprobs: false });
    expect(fake.requests.filter((r) => isProbe(r.body)).length).toBeGreaterThan(1);
  });

  it("remembers a failed probe briefly: one probe per interval, not one per request; then probes again", async () => {
    let failing = true;
    let clock = 1_700_000_000_123.5;
    const fake = await startFakeLlm(() => (failing ? { status: 401, json: { error: { message: "bad key" } } } : PROBE_OK));
    onTestFinished(() => fake.close());
    const client = createLlmClient({ config: fakeLlmConfig(fake, { maxRetries: 0 }), logger: createLogger("silent"), now: () => clock });
    await expect(client.capabilities(opts())).rejects.toMatchObject({ code: "upstream_error", status: 401 });
    failing = false;
    await expect(client.capabilities(opts())).rejects.toMatchObject({ status: 401 });
    expect(fake.requests).toHaveLength(1);
    clock += PROBE_FAILURE_TTL_MS;
    expect(await client.capabilities(opts())).toMatchObject({ logprobs: true });
    expect(fake.requests).toHaveLength(2);
    // Capabilities are probed again after a while.
    await client.capabilities(opts());
    clock += CAPABILITIES_TTL_MS;
    await client.capabilities(opts());
    expect(fake.requests).toHaveLength(3);
  });

  it.each([
    ["an SSE stream", { text: 'data: {"choices":[]}\n\ndata: [DONE]\n\n', headers: { "content-type": "text/event-stream" } }],
    ["a 200 without choices", { json: { object: "chat.completion", choices: [] } }],
    ["a 200 that is not JSON", { text: "<html>gateway</html>" }],
  ])("a probe answered with %s is a retryable failure, not a verdict on logprobs", async (_name, reply) => {
    let odd = true;
    const clock = { t: 1_700_000_000_000.25 };
    const fake = await startFakeLlm(() => (odd ? reply : PROBE_OK));
    onTestFinished(() => fake.close());
    const client = createLlmClient({ config: fakeLlmConfig(fake, { maxRetries: 0 }), logger: createLogger("silent"), now: () => clock.t });
    await expect(client.capabilities(opts())).rejects.toMatchObject({ code: "upstream_error", retryable: true });
    odd = false;
    clock.t += PROBE_FAILURE_TTL_MS;
    expect(await client.capabilities(opts())).toMatchObject({ logprobs: true, topLogprobs: 20 });
  });
});

describe("calls", () => {
  it("retries a 429 after its Retry-After and a 500, then answers", async () => {
    let questions = 0;
    const { fake, client } = await setup((r) => {
      if (isProbe(r.body)) return PROBE_OK;
      questions += 1;
      if (questions === 1) return { status: 429, headers: { "retry-after": "0" }, json: { error: { message: "slow down" } } };
      if (questions === 2) return { status: 500, text: "oops" };
      return logprobsReply({ A: 1 }, { prompt: 42, cached: 40 });
    });
    const completion = await client.complete(ask, opts());
    expect(completion.usage).toEqual({ promptTokens: 42, cachedTokens: 40, completionTokens: 1 });
    expect(fake.questionRequests()).toHaveLength(3);
  });

  it("gives up after maxRetries with a fixed message that carries no upstream text", async () => {
    const { fake, client } = await setup((r) =>
      isProbe(r.body) ? PROBE_OK : { status: 503, text: "upstream-secret-detail sk-upstream-secret" },
    );
    const err = await client.complete(ask, opts()).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(LlmCallError);
    expect(err).toMatchObject({ code: "upstream_error", retryable: true, status: 503 });
    expect((err as Error).message).not.toMatch(/secret/);
    expect(fake.questionRequests()).toHaveLength(3);
  });

  it.each([
    { name: "not JSON", text: "<html>bad gateway</html>" },
    { name: "no choices", text: '{"object":"chat.completion"}' },
  ])("rejects a malformed 200 body ($name)", async ({ text }) => {
    const { client } = await setup((r) => (isProbe(r.body) ? PROBE_OK : { text }));
    await expect(client.complete(ask, opts())).rejects.toMatchObject({ code: "upstream_error" });
  });

  it("times out a hanging response per attempt and retries within the deadline", async () => {
    const never = deferred();
    let questions = 0;
    const { client } = await setup(
      (r) => {
        if (isProbe(r.body)) return PROBE_OK;
        questions += 1;
        return questions === 1 ? { hold: never.promise } : logprobsReply({ B: 1 });
      },
      { callTimeoutMs: 400 },
    );
    const completion = await client.complete(ask, opts());
    expect(completion.firstToken?.token).toBe("B");
    expect(questions).toBe(2);
    never.resolve();
  });

  it("reports a timeout when every attempt hangs", async () => {
    const never = deferred();
    const { client } = await setup((r) => (isProbe(r.body) ? PROBE_OK : { hold: never.promise }), { callTimeoutMs: 100, maxRetries: 1 });
    await expect(client.complete(ask, opts())).rejects.toMatchObject({ code: "timeout" });
    never.resolve();
  });

  it("cancels a call when the caller goes away", async () => {
    const never = deferred();
    const { fake, client } = await setup((r) => (isProbe(r.body) ? PROBE_OK : { hold: never.promise }));
    const controller = new AbortController();
    const call = client.complete(ask, opts(controller.signal));
    await fake.received(2);
    controller.abort();
    await expect(call).rejects.toMatchObject({ code: "aborted" });
    never.resolve();
  });

  it("caps concurrent upstream calls per process", async () => {
    const release = deferred();
    let inFlight = 0;
    let maxInFlight = 0;
    const { fake, client } = await setup(
      async (r) => {
        if (isProbe(r.body)) return PROBE_OK;
        inFlight += 1;
        maxInFlight = Math.max(maxInFlight, inFlight);
        await release.promise;
        inFlight -= 1;
        return logprobsReply({ A: 1 });
      },
      { maxConcurrentCalls: 2 },
    );
    await client.capabilities(opts());
    const calls = Array.from({ length: 5 }, () => client.complete(ask, opts()));
    await fake.received(3);
    release.resolve();
    await Promise.all(calls);
    expect(maxInFlight).toBe(2);
    expect(fake.questionRequests()).toHaveLength(5);
  });
});

describe("sharing the concurrent-call slots", () => {
  const question = (text: string) => ({ kind: "logprobs" as const, messages: [{ role: "user" as const, content: text }] });
  const textOf = (r: { body: { messages: { content: string }[] } }) => r.body.messages.at(-1)!.content;

  it("goes round-robin between requests: a 1-question request queued behind a 10-question one is served next", async () => {
    const firstHeld = deferred();
    const { fake, client } = await setup(
      async (r) => {
        if (isProbe(r.body)) return PROBE_OK;
        if (textOf(r) === "big-0") await firstHeld.promise;
        return logprobsReply({ A: 1 });
      },
      { maxConcurrentCalls: 1 },
    );
    await client.capabilities(opts());
    const big = { ...opts(), party: {} };
    const small = { ...opts(), party: {} };
    const bigCalls = Array.from({ length: 10 }, (_, i) => client.complete(question(`big-${i}`), big));
    await fake.received(2); // the probe and big-0, which holds the only slot
    const smallCall = client.complete(question("small"), small);
    await waitFor(() => client.waitingCalls() === 10, "nine big calls and the small one to queue");
    firstHeld.resolve();
    await Promise.all([...bigCalls, smallCall]);
    expect(fake.questionRequests().map(textOf).slice(0, 3)).toEqual(["big-0", "small", "big-1"]);
    expect(client.waitingCalls()).toBe(0);
  });

  it("a call waiting out a Retry-After gives its slot to the next call meanwhile", async () => {
    let limited = 0;
    const { fake, client } = await setup(
      (r) => {
        if (isProbe(r.body)) return PROBE_OK;
        // OpenAI's 429 (platform.openai.com/docs/guides/error-codes): a rate-limit error with Retry-After in seconds.
        if (textOf(r) === "first" && limited++ === 0) {
          return { status: 429, headers: { "retry-after": "1" }, json: { error: { message: "Rate limit reached for requests", type: "requests", param: null, code: "rate_limit_exceeded" } } };
        }
        return logprobsReply({ A: 1 });
      },
      { maxConcurrentCalls: 1 },
    );
    await client.capabilities(opts());
    const first = client.complete(question("first"), { ...opts(), party: {} });
    await fake.received(2);
    const second = client.complete(question("second"), { ...opts(), party: {} });
    await Promise.all([first, second]);
    expect(fake.questionRequests().map(textOf)).toEqual(["first", "second", "first"]);
  });

  it("a waiter whose caller goes away leaves the queue", async () => {
    const held = deferred();
    const { fake, client } = await setup(
      async (r) => {
        if (isProbe(r.body)) return PROBE_OK;
        await held.promise;
        return logprobsReply({ A: 1 });
      },
      { maxConcurrentCalls: 1 },
    );
    await client.capabilities(opts());
    const running = client.complete(question("running"), opts());
    await fake.received(2);
    const caller = new AbortController();
    const gone = client.complete(question("gone"), { ...opts(caller.signal), party: {} });
    await waitFor(() => client.waitingCalls() === 1, "the second call to queue");
    caller.abort();
    await expect(gone).rejects.toMatchObject({ code: "aborted" });
    expect(client.waitingCalls()).toBe(0);
    held.resolve();
    await running;
    expect(fake.questionRequests().map(textOf)).toEqual(["running"]);
  });
});

describe("readUsage", () => {
  it.each([
    { name: "OpenAI: cached is a subset", usage: { prompt_tokens: 100, prompt_tokens_details: { cached_tokens: 64 } }, expected: { promptTokens: 100, cachedTokens: 64 } },
    { name: "no details", usage: { prompt_tokens: 100 }, expected: { promptTokens: 100, cachedTokens: 0 } },
    { name: "llama-server: only new tokens counted", usage: { prompt_tokens: 10 }, timings: { prompt_n: 10, cache_n: 90 }, expected: { promptTokens: 100, cachedTokens: 90 } },
    { name: "cached above prompt: it was excluded", usage: { prompt_tokens: 10, prompt_tokens_details: { cached_tokens: 90 } }, expected: { promptTokens: 100, cachedTokens: 90 } },
  ])("$name", ({ usage, timings, expected }) => {
    expect(readUsage({ usage, ...(timings ? { timings } : {}) })).toMatchObject(expected);
  });

  it("is undefined without usage", () => {
    expect(readUsage({})).toBeUndefined();
  });
});
