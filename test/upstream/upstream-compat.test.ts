import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { THINKING_BUDGET_TOKENS } from "../../src/upstream/llm-client.js";
import { balanceUnits, createTestAccount, postJson, startTestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { assertInvariants } from "../support/invariants.js";
import {
  isProbe,
  logprobsReply,
  startFakeLlm,
  textReply,
  userContent,
  vllmMaxLogprobs,
  type ChatBody,
  type FakeReply,
  type ReceivedRequest,
} from "../support/fake-llm.js";

/**
 * The upstream compatibility suite: one fake per real server profile, each
 * reproducing that server's request validation and error text (the source of
 * each quirk is named beside it), and for each the same decision through the
 * whole service: the answers, how they were read (`x_method`), the upstream
 * calls spent (probes apart) and the charge. Every profile's model holds the
 * same beliefs, so a right client gets the same answers from all of them.
 */

const DECISION = {
  model: "typesafe/service-1.13",
  state: { ticket: "I was charged twice for my pro plan" },
  questions: {
    urgent: { type: "noul", instructions: "Is it urgent?" },
    team: { type: "choice", instructions: "Which team?", criteria: { billing: null, technical: null, sales: null } },
  },
};
const BELIEF: Record<string, number> = { yes: 0.8, no: 0.2, billing: 0.7, technical: 0.2, sales: 0.1 };
/** Every question call reports this many prompt tokens; probes are never billed. */
const PROMPT_TOKENS = 100;

/** The labels of a question block (`A: billing`, or yes/no for a noul) with the model's belief in each. */
function beliefsOf(request: ReceivedRequest): Array<[string, number]> {
  const text = userContent(request);
  const listed = [...text.matchAll(/^([A-Za-z0-9]+): (.+)$/gm)].filter((m) => m[2]! in BELIEF);
  if (listed.length > 0) return listed.map((m) => [m[1]!, BELIEF[m[2]!]!]);
  return [
    ["yes", BELIEF.yes!],
    ["no", BELIEF.no!],
  ];
}

/** A logprobs answer: each label's belief spread over the spellings the server returns for it. */
function logprobsAnswer(request: ReceivedRequest, spell: (label: string) => Array<[string, number]>, cached = 0): FakeReply {
  const entries = beliefsOf(request).flatMap(([label, p]) => spell(label).map(([token, share]): [string, number] => [token, p * share]));
  return logprobsReply([...entries, ["Z", 0]], { prompt: PROMPT_TOKENS, cached });
}

/** A verbalized answer: the JSON object the prompt asks for, after `preamble`. */
function statedAnswer(request: ReceivedRequest, preamble = ""): FakeReply {
  return textReply(preamble + JSON.stringify(Object.fromEntries(beliefsOf(request))), { prompt: PROMPT_TOKENS, completion: 20 });
}

/** OpenAI's 400 body (`error.message/type/param/code`) for a parameter a model refuses (aandrew-me/tgpt#333, microsoft/vscode#282170). */
function openAiUnsupported(param: string, extra = ""): FakeReply {
  return {
    status: 400,
    json: { error: { message: `Unsupported parameter: '${param}' is not supported with this model.${extra}`, type: "invalid_request_error", param, code: "unsupported_parameter" } },
  };
}

/** OpenAI's answer to a field it does not know at all (the body of a 400 for an unrecognized argument). */
function openAiUnrecognized(param: string): FakeReply {
  return { status: 400, json: { error: { message: `Unrecognized request argument supplied: ${param}`, type: "invalid_request_error", param: null, code: null } } };
}

/** A pydantic literal error as vLLM relays it (vllm/entrypoints/openai/api_server.py validation_exception_handler → ErrorResponse). */
function vllmLiteral(field: string, input: string, allowed: string): FakeReply {
  return {
    status: 400,
    json: {
      object: "error",
      message: `[{'type': 'literal_error', 'loc': ('body', '${field}'), 'msg': "Input should be ${allowed}", 'input': '${input}', 'ctx': {'expected': "${allowed}"}}]`,
      type: "BadRequestError",
      param: null,
      code: 400,
    },
  };
}

/** vLLM's ChatCompletionRequest: `reasoning_effort: Literal["low", "medium", "high"] | None` (vllm/entrypoints/openai/protocol.py). */
function vllmValidation(body: ChatBody, maxLogprobs: number): FakeReply | undefined {
  if (body.reasoning_effort !== undefined && !["low", "medium", "high"].includes(String(body.reasoning_effort))) {
    return vllmLiteral("reasoning_effort", String(body.reasoning_effort), "'low', 'medium' or 'high'");
  }
  if (body.logprobs && Number(body.top_logprobs) > maxLogprobs) return vllmMaxLogprobs(Number(body.top_logprobs), maxLogprobs);
  return undefined;
}

interface Profile {
  name: string;
  reply(request: ReceivedRequest): FakeReply;
  method: "logprobs" | "verbalized";
  /** Probe calls until the capabilities were known: one per refusal the server makes, then the accepted forms. */
  probes: number;
  /** Tokens each question call was billed (prompt plus cached tokens a server reported apart). */
  billedPerCall?: number;
  /** Cached prompt tokens each question call reported. */
  cachedPerCall?: number;
  /** What every question request must carry, and what it must not. */
  sends?: Partial<ChatBody>;
  omits?: string[];
  check?(question: ChatBody): void;
}

const PROFILES: Profile[] = [
  {
    // gpt-4o: top_logprobs up to 20; no reasoning_effort (openAiUnsupported); unknown fields are refused.
    name: "OpenAI chat model (gpt-4o)",
    reply: ({ body, ...request }) =>
      "chat_template_kwargs" in body
        ? openAiUnrecognized("chat_template_kwargs")
        : "reasoning_effort" in body
          ? openAiUnsupported("reasoning_effort")
          : logprobsAnswer({ body, ...request }, (label) => [
              [label, 0.9],
              [` ${label}`, 0.1],
            ]),
    method: "logprobs",
    probes: 3,
    sends: { top_logprobs: 20, temperature: 1, max_tokens: 1 },
    omits: ["reasoning_effort", "chat_template_kwargs"],
  },
  {
    // o4-mini: no top_p/temperature/logprobs, max_completion_tokens, reasoning_effort low..high. The unsupported-value text is
    // OpenAI's as recorded in Kilo-Org/cloud#3807 (there for gpt-5, whose list starts at 'minimal').
    name: "OpenAI reasoning model (o4-mini)",
    reply: (request) => {
      const { body } = request;
      if ("chat_template_kwargs" in body) return openAiUnrecognized("chat_template_kwargs");
      if (body.reasoning_effort !== undefined && body.reasoning_effort !== "low" && body.reasoning_effort !== "medium" && body.reasoning_effort !== "high") {
        return {
          status: 400,
          json: {
            error: {
              message: `Unsupported value: 'reasoning_effort' does not support '${String(body.reasoning_effort)}' with this model. Supported values are: 'low', 'medium', and 'high'.`,
              type: "invalid_request_error",
              param: "reasoning_effort",
              code: "unsupported_value",
            },
          },
        };
      }
      if ("top_p" in body) return openAiUnsupported("top_p");
      if ("temperature" in body) return openAiUnsupported("temperature");
      if ("max_tokens" in body) return openAiUnsupported("max_tokens", " Use 'max_completion_tokens' instead.");
      if (body.logprobs) return openAiUnsupported("logprobs");
      return isProbe(body) ? textReply('{"yes": 1}') : statedAnswer(request);
    },
    method: "verbalized",
    probes: 7,
    sends: { reasoning_effort: "low" },
    omits: ["top_p", "temperature", "max_tokens", "logprobs", "chat_template_kwargs"],
    check: (question) => expect(question.max_completion_tokens).toBeGreaterThanOrEqual(THINKING_BUDGET_TOKENS),
  },
  {
    // vLLM --max-logprobs 5, raw SentencePiece pieces (vllm#16838) and two pieces decoded alike (vllm#44319), -9999 for
    // the impossible, cached tokens in prompt_tokens_details.
    name: "vLLM (--max-logprobs 5, raw pieces, duplicate strings)",
    reply: (request) =>
      vllmValidation(request.body, 5) ??
      logprobsAnswer(
        request,
        (label) => [
          [`▁${label}`, 0.5],
          [label, 0.3],
          [label, 0.2],
        ],
        // usage.prompt_tokens_details.cached_tokens (vLLM --enable-prompt-tokens-details).
        64,
      ),
    method: "logprobs",
    probes: 3,
    cachedPerCall: 64,
    sends: { reasoning_effort: "low", top_logprobs: 5, chat_template_kwargs: { enable_thinking: false } },
  },
  {
    // SGLang: the same pydantic literal for reasoning_effort (sglang/srt/entrypoints/openai/protocol.py), byte-level BPE
    // pieces with `Ġ`, strings decoded alike (sglang#32290).
    name: "SGLang (Ġ pieces, duplicate strings)",
    reply: (request) =>
      vllmValidation(request.body, 20) ??
      logprobsAnswer(request, (label) => [
        [`Ġ${label}`, 0.6],
        [` ${label}`, 0.4],
      ]),
    method: "logprobs",
    probes: 2,
    sends: { reasoning_effort: "low", top_logprobs: 20 },
  },
  {
    // llama.cpp server: unknown fields are ignored; older builds count only new prompt tokens and report the cached
    // ones as timings.cache_n (ollama/ollama#16414).
    name: "llama.cpp server (cached tokens in timings)",
    reply: (request) => {
      const reply = logprobsAnswer(request, (label) => [[` ${label}`, 1]]);
      const json = reply.json as { usage: Record<string, unknown>; timings?: unknown };
      json.usage = { prompt_tokens: 40, completion_tokens: 1, total_tokens: 41 };
      json.timings = { prompt_n: 40, cache_n: 60 };
      return reply;
    },
    method: "logprobs",
    probes: 1,
    // The 40 new prompt tokens and the 60 served from the cache.
    billedPerCall: 40 + 60,
    cachedPerCall: 60,
    sends: { reasoning_effort: "none", chat_template_kwargs: { enable_thinking: false } },
  },
  {
    // Ollama /v1 before logprobs support: the fields are accepted and ignored (no `logprobs` in the reply); a thinking
    // model (qwen3) thinks unless reasoning_effort is "none", the only switch its /v1 route honours (ollama/ollama#14820).
    name: "Ollama /v1 (logprobs ignored, thinking model)",
    reply: (request) => {
      const thinking = request.body.reasoning_effort !== "none";
      if (isProbe(request.body)) return textReply(thinking ? "<think>\nThe user wants yes.\n</think>\n\nyes" : "yes");
      return statedAnswer(request, thinking ? "<think>\nWeighing {the labels}.\n</think>\n\n" : "");
    },
    method: "verbalized",
    probes: 3,
    sends: { reasoning_effort: "none" },
    check: (question) => expect(question.response_format?.type).toBe("json_schema"),
  },
  {
    // Ollama /v1 since 0.12.11: logprobs and top_logprobs (at most 20) are honoured; chat_template_kwargs still ignored.
    name: "Ollama /v1 with logprobs",
    reply: (request) => logprobsAnswer(request, (label) => [[label, 1]]),
    method: "logprobs",
    probes: 1,
    sends: { reasoning_effort: "none", top_logprobs: 20 },
  },
  {
    // Gemma 2 behind vLLM: its chat template raises 'System role not supported', relayed as a 400.
    name: "Gemma 2 behind vLLM (no system role)",
    reply: (request) =>
      vllmValidation(request.body, 20) ??
      (request.body.messages.some((m) => m.role === "system")
        ? { status: 400, json: { object: "error", message: "System role not supported", type: "BadRequestError", param: null, code: 400 } }
        : logprobsAnswer(request, (label) => [[label, 1]])),
    method: "logprobs",
    probes: 3,
    check: (question) => expect(question.messages.map((m) => m.role)).toEqual(["user"]),
  },
  {
    // An always-thinking model (DeepSeek-R1 on llama.cpp): every switch accepted and ignored, the first token is `<think>`.
    name: "always-thinking model (DeepSeek-R1)",
    reply: (request) => {
      if (request.body.logprobs) return logprobsReply({ "<think>": 0.97, yes: 0.02, no: 0.01 }, { prompt: PROMPT_TOKENS });
      if (isProbe(request.body)) return textReply("<think>\nThey want one word.\n</think>\n\nyes");
      return statedAnswer(request, "<think>\nThe charge was doubled, so {billing} it is.\n</think>\n\n");
    },
    method: "verbalized",
    probes: 3,
    omits: ["logprobs"],
    check: (question) => expect(question.max_tokens).toBeGreaterThan(THINKING_BUDGET_TOKENS),
  },
];

let database: TestDatabase;
beforeAll(async () => {
  database = await createTestDatabase();
});
afterAll(async () => {
  await database?.close();
});

describe("upstream compatibility", () => {
  // Concurrent: each profile has its own fake and service (capabilities are cached per process), and a stop waits out the grace period.
  it.concurrent.for(PROFILES)("$name: right answers, $method, the calls it needs, charged only for the questions", async (profile, { onTestFinished }) => {
    const fake = await startFakeLlm((request) => profile.reply(request));
    onTestFinished(() => fake.close());
    const service = await startTestApp(database, { TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_LLM_MODEL: "fake-model", TYPESAFE_LLM_MAX_RETRIES: "0" });
    onTestFinished(() => service.stop());
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 10_000_000 });

    const res = await postJson(`${service.url}/api/v1/decisions`, DECISION, { apiKey });

    expect(res.status).toBe(200);
    const answers = res.body.data.answers as Record<string, Record<string, unknown>>;
    expect(answers.urgent).toMatchObject({ type: "noul", noul: 0.8, x_method: profile.method });
    expect(answers.team).toMatchObject({
      type: "choice",
      choice: "billing",
      probabilities: { billing: 0.7, technical: 0.2, sales: 0.1 },
      x_method: profile.method,
    });
    // logprobs: one call per question; verbalized: one per option order (2 for a noul, 3 for a 3-option choice).
    const questionCalls = profile.method === "logprobs" ? 2 : 5;
    expect(fake.questionRequests()).toHaveLength(questionCalls);
    expect(fake.requests.filter((r) => isProbe(r.body))).toHaveLength(profile.probes);
    const billed = questionCalls * (profile.billedPerCall ?? PROMPT_TOKENS);
    expect(res.body.data.usage).toMatchObject({ input_tokens: billed, cached_input_tokens: questionCalls * (profile.cachedPerCall ?? 0), upstream_calls: questionCalls });
    expect(await balanceUnits(database.db, accountId)).toBe(10_000_000 - billed);
    await assertInvariants(database.db, accountId);

    for (const { body } of fake.questionRequests()) {
      expect(body).toMatchObject(profile.sends ?? {});
      for (const field of profile.omits ?? []) expect(body).not.toHaveProperty(field);
      profile.check?.(body);
    }
  });
});
