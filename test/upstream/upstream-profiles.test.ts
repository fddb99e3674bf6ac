import { describe, expect, it, onTestFinished } from "vitest";
import { parseVerbalized, withoutReasoning } from "../../src/decision/upstream-scorer.js";
import { createLogger } from "../../src/logger.js";
import { adjustAfterRejection, createLlmClient, logprobCapIn, type LlmCapabilities } from "../../src/upstream/llm-client.js";
import type { CallOptions } from "../../src/upstream/model-call.js";
import { fakeLlmConfig, isProbe, logprobsReply, PROBE_OK, startFakeLlm, textReply, vllmMaxLogprobs, type ChatBody, type FakeReply } from "../support/fake-llm.js";

/**
 * The request validation of real OpenAI-compatible servers, reproduced by the
 * fake with each server's own status and error body, and what the client
 * learns from each: it drops exactly the parameter named, reads a logprob cap
 * from the text, and folds the system prompt into the user message for
 * templates without a system role.
 */
const opts = (): CallOptions => ({ signal: new AbortController().signal, deadlineMs: Date.now() + 5_000 });

/** OpenAI's 400 for a parameter a model refuses, as recorded in aandrew-me/tgpt#333 (o1) and microsoft/vscode#282170 (gpt-5.1). */
function openAiUnsupported(param: string): FakeReply {
  return {
    status: 400,
    json: { error: { message: `Unsupported parameter: '${param}' is not supported with this model.`, type: "invalid_request_error", param, code: "unsupported_parameter" } },
  };
}

/** A chat template without a system role (Gemma 2: `raise_exception('System role not supported')`), as vLLM relays it. */
const SYSTEM_ROLE_REFUSED: FakeReply = {
  status: 400,
  json: { object: "error", message: "System role not supported", type: "BadRequestError", param: null, code: 400 },
};

const PROFILES: Array<{ name: string; reply: (body: ChatBody) => FakeReply | undefined; expected: Partial<LlmCapabilities> }> = [
  {
    name: "OpenAI reasoning model (o4-mini, gpt-5): no top_p/temperature, max_completion_tokens, no logprobs",
    reply: (body) =>
      "top_p" in body
        ? openAiUnsupported("top_p")
        : "temperature" in body
          ? openAiUnsupported("temperature")
          : "max_tokens" in body
            ? { status: 400, json: { error: { message: "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.", type: "invalid_request_error", param: "max_tokens", code: "unsupported_parameter" } } }
            : body.logprobs
              ? openAiUnsupported("logprobs")
              : undefined,
    expected: { sampling: false, maxTokensField: "max_completion_tokens", logprobs: false },
  },
  {
    name: "vLLM started with --max-logprobs 5",
    reply: (body) => (Number(body.top_logprobs) > 5 ? vllmMaxLogprobs(Number(body.top_logprobs), 5) : undefined),
    expected: { logprobs: true, topLogprobs: 5, sampling: true, systemRole: true },
  },
  {
    name: "Fireworks: logprobs must be between 0 and 5",
    reply: (body) => (Number(body.top_logprobs) > 5 ? { status: 400, json: { error: { object: "error", type: "invalid_request_error", message: `logprobs must be between 0 and 5: ${body.top_logprobs}` } } } : undefined),
    expected: { logprobs: true, topLogprobs: 5 },
  },
  {
    name: "Gemma 2 behind vLLM: no system role",
    reply: (body) => (body.messages.some((m) => m.role === "system") ? SYSTEM_ROLE_REFUSED : undefined),
    expected: { systemRole: false, logprobs: true, topLogprobs: 20 },
  },
];

describe("upstream profiles", () => {
  it.each(PROFILES)("$name", async ({ reply, expected }) => {
    const fake = await startFakeLlm((request) => reply(request.body) ?? (request.body.logprobs ? PROBE_OK : textReply('{"yes": 1}')));
    onTestFinished(() => fake.close());
    const client = createLlmClient({ config: fakeLlmConfig(fake, { maxRetries: 0 }), logger: createLogger("silent") });
    const caps = await client.capabilities(opts());
    expect(caps).toMatchObject(expected);
    // Every later call is sent in the accepted form: the profile's fake refuses nothing more.
    fake.setHandler((request) => reply(request.body) ?? (isProbe(request.body) ? PROBE_OK : request.body.logprobs ? logprobsReply({ A: 0.7, B: 0.3 }) : textReply('{"A": 0.7, "B": 0.3}')));
    const asked = await client.complete(
      caps.logprobs
        ? { kind: "logprobs", messages: [{ role: "system", content: "Answer with one letter." }, { role: "user", content: "Q" }] }
        : { kind: "json", messages: [{ role: "system", content: "Answer in JSON." }, { role: "user", content: "Q" }], schema: { type: "object" }, maxTokens: 32 },
      opts(),
    );
    expect(asked.content).not.toBe("");
    const sent = fake.questionRequests().at(-1)!.body;
    if (expected.systemRole === false) {
      expect(sent.messages).toEqual([{ role: "user", content: "Answer with one letter.\n\nQ" }]);
    }
    if (expected.sampling === false) expect(sent).not.toHaveProperty("top_p");
  });
});

function capabilities(): LlmCapabilities {
  return {
    logprobs: true,
    topLogprobs: 20,
    maxTokensField: "max_tokens",
    thinkingSwitch: true,
    reasoningEffort: "none",
    alwaysThinks: false,
    jsonSchema: false,
    sampling: true,
    systemRole: true,
  };
}

describe("the answer of a model that reasons in its content", () => {
  it.each([
    ['<think>\nMaybe {"yes": 0}?\n</think>\n\n{"yes": 0.7, "no": 0.3}', '\n\n{"yes": 0.7, "no": 0.3}'],
    ["<think>\nStill weighing {the", ""],
    ['<|channel|>analysis<|message|>Think {x}.<|end|><|start|>assistant<|channel|>final<|message|>{"A": 1}', '{"A": 1}'],
    ["<|channel|>analysis<|message|>Ran out", ""],
    ['{"yes": 1}', '{"yes": 1}'],
  ])("%j → %j", (content, answer) => {
    expect(withoutReasoning(content)).toBe(answer);
  });

  it("a stated distribution is read after the reasoning, never from inside it", () => {
    expect(parseVerbalized('<think>\n{"yes": 0, "no": 1} is wrong\n</think>\n{"yes": 0.75, "no": 0.25}', ["yes", "no"])).toEqual([0.75, 0.25]);
  });
});

describe("reading a rejection", () => {
  it.each([
    ["requested sample logprobs of 20, which is greater than max allowed: 5", 5],
    ["logprobs must be between 0 and 5: 20", 5],
    ["top_logprobs must be <= 10", 10],
    ["top_logprobs must be less than or equal to 8", 8],
    ["logprobs are not supported with reasoning models", undefined],
  ])("%s → cap %s", (text, cap) => {
    expect(logprobCapIn(text)).toBe(cap);
  });

  it.each([
    // OpenAI gpt-5, as recorded in Kilo-Org/cloud#3807.
    ["Unsupported value: 'reasoning_effort' does not support 'none' with this model. Supported values are: 'minimal', 'low', 'medium', and 'high'.", "minimal"],
    ["Unsupported value: 'reasoning_effort' does not support 'none' with this model. Supported values are: 'low', 'medium', and 'high'.", "low"],
    // vLLM's pydantic literal error.
    [`[{'type': 'literal_error', 'loc': ('body', 'reasoning_effort'), 'msg': "Input should be 'low', 'medium' or 'high'", 'input': 'none'}]`, "low"],
    ["Unsupported parameter: 'reasoning_effort' is not supported with this model.", undefined],
  ])("%s → reasoning_effort %s", (text, effort) => {
    const caps = capabilities();
    expect(adjustAfterRejection(caps, text)).toBe(true);
    expect(caps).toMatchObject({ reasoningEffort: effort, thinkingSwitch: true, sampling: true, logprobs: true });
  });

  it("an unnamed complaint drops the reasoning effort first, then the thinking switch, then logprobs", () => {
    const caps = capabilities();
    const steps = [1, 2, 3, 4].map(() => (adjustAfterRejection(caps, "Bad Request"), { ...caps }));
    expect(steps.map((c) => [c.reasoningEffort, c.thinkingSwitch, c.logprobs])).toEqual([
      [undefined, true, true],
      [undefined, false, true],
      [undefined, false, false],
      [undefined, false, false],
    ]);
    expect(adjustAfterRejection(caps, "Bad Request")).toBe(false);
  });

  it("drops only what a rejection names, one thing at a time", () => {
    const caps = capabilities();
    expect(adjustAfterRejection(caps, "Unsupported parameter: 'top_p' is not supported with this model.")).toBe(true);
    expect(caps).toMatchObject({ sampling: false, logprobs: true, thinkingSwitch: true, systemRole: true });
    expect(adjustAfterRejection(caps, "Requested sample logprobs of 20, which is greater than max allowed: 1")).toBe(true);
    // A cap of 1 leaves no window to read: logprobs go, the verbalized path takes over.
    expect(caps).toMatchObject({ logprobs: false });
  });
});
