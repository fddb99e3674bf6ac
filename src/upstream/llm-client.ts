import type { LlmCallOutcome, Metrics } from "../metrics.js";
import type { LlmConfig } from "../config.js";
import type { Logger } from "../logger.js";
import { isRetryableStatus, postWithRetry, UpstreamError, type HttpResponse } from "./http.js";
import { createFairSemaphore } from "./fair-semaphore.js";
import { isReasoningOpener, mostProbable, type TokenLogprob } from "./logprob-window.js";
import { LlmCallError, type CallOptions, type ChatMessage, type ChatUsage } from "./model-call.js";

/**
 * A client for OpenAI-compatible Chat Completions, shaped for reading one
 * next-token distribution per call. It owns what differs between servers:
 * the capability probe (cached once per client, i.e. once per process and
 * upstream model), the request fields each server accepts, the per-process
 * cap on concurrent calls, and the usage-reporting quirks.
 */
export interface LlmClient {
  /**
   * Probes once and caches for CAPABILITIES_TTL_MS, or until
   * REPROBE_AFTER_REJECTIONS calls in a row are refused; concurrent callers share
   * one probe. A failed probe is remembered for PROBE_FAILURE_TTL_MS, so a
   * broken upstream costs one probe per interval, not one per request.
   */
  capabilities(options: CallOptions): Promise<LlmCapabilities>;
  complete(request: ChatRequest, options: CallOptions): Promise<ChatCompletion>;
  /** Calls waiting for one of the TYPESAFE_LLM_MAX_CONCURRENT_CALLS slots. */
  waitingCalls(): number;
}

export interface LlmCapabilities {
  /** Logprobs are accepted and come back non-empty and non-degenerate. */
  logprobs: boolean;
  /** The `top_logprobs` value the server accepted. */
  topLogprobs: number;
  maxTokensField: "max_tokens" | "max_completion_tokens";
  /** The server accepts `chat_template_kwargs: {enable_thinking: false}`. */
  thinkingSwitch: boolean;
  /**
   * The lowest `reasoning_effort` the model accepts (`none` turns thinking off
   * on Ollama's /v1 route and gpt-5.1; o-series models take `low`), or
   * undefined where the parameter is refused (gpt-4o).
   */
  reasoningEffort: ReasoningEffort | undefined;
  /**
   * The model opens with a reasoning token whatever it is told (DeepSeek-R1,
   * gpt-oss): its first-token logprobs say nothing about the answer, so it is
   * asked on the verbalized path with room to think first.
   */
  alwaysThinks: boolean;
  /** The server accepts `response_format: {type: "json_schema"}` (probed only without logprobs). */
  jsonSchema: boolean;
  /** The model accepts `temperature` and `top_p` (OpenAI's reasoning models refuse them). */
  sampling: boolean;
  /** The chat template has a system role (Gemma 2 and Mistral v0.1 templates raise without one). */
  systemRole: boolean;
}

/** Reasoning efforts, the least reasoning first. */
export const REASONING_EFFORTS = ["none", "minimal", "low", "medium", "high"] as const;
export type ReasoningEffort = (typeof REASONING_EFFORTS)[number];

/** Output tokens a model that always thinks gets on top of its answer's budget. */
export const THINKING_BUDGET_TOKENS = 2_048;

export type ChatRequest =
  | { kind: "logprobs"; messages: ChatMessage[]; cacheKey?: string }
  | { kind: "json"; messages: ChatMessage[]; schema: Record<string, unknown>; maxTokens: number; cacheKey?: string };

export interface ChatCompletion {
  content: string;
  /** The sampled first token, when logprobs were asked for. */
  firstToken: TokenLogprob | undefined;
  /** The window of alternatives at the first position. */
  topLogprobs: TokenLogprob[] | undefined;
  /** Absent when the server reported none; the caller estimates. */
  usage: ChatUsage | undefined;
  /** The model refused (a `refusal` message or a content filter stop). */
  refused: boolean;
}

const PROBE_MESSAGES: ChatMessage[] = [
  { role: "system", content: "Capability check. Reply with one word." },
  { role: "user", content: "Reply with the word yes." },
];
const PREFERRED_TOP_LOGPROBS = 20;
/**
 * Each rejection adjusts one setting: reasoning effort (raised, then dropped),
 * thinking switch, max tokens field, sampling, system role, logprob cap,
 * logprobs; a reasoning opener on the probe turns logprobs off.
 */
const MAX_PROBE_ATTEMPTS = 10;
/** Capabilities are probed again after this, so a redeployed upstream is noticed. */
export const CAPABILITIES_TTL_MS = 15 * 60_000;
/** A failed probe is the answer for this long. */
export const PROBE_FAILURE_TTL_MS = 5_000;
/**
 * This many calls in a row refused with a 4xx (not 408/429) mean the upstream
 * no longer takes what the probe found (a model or server swapped behind the
 * same URL): the capabilities are probed again on the next request.
 */
export const REPROBE_AFTER_REJECTIONS = 3;

/** The party of calls made for no decision request (the capability probe): they take their turn together. */
const NO_REQUEST_PARTY = {};

export function createLlmClient(deps: {
  config: LlmConfig;
  logger: Logger;
  now?: () => number;
  metrics?: Pick<Metrics, "recordLlmCall">;
}): LlmClient {
  const { config, logger, metrics } = deps;
  const now = deps.now ?? Date.now;
  const baseUrl = config.baseUrl;
  const slots = createFairSemaphore(config.maxConcurrentCalls);
  /** OpenAI proper documents `prompt_cache_key`; other servers may reject unknown fields. */
  const sendsCacheKey = baseUrl !== undefined && /^https:\/\/api\.openai\.com\b/.test(baseUrl);
  let probed: Promise<LlmCapabilities> | undefined;
  /** When the current probe's answer (capabilities or failure) stops counting; Infinity while it runs. */
  let probedUntil = 0;
  let rejectedInARow = 0;

  async function post(body: Record<string, unknown>, options: CallOptions, maxRetries: number): Promise<HttpResponse> {
    if (baseUrl === undefined) throw new LlmCallError("rejected", false);
    const started = performance.now();
    let outcome: LlmCallOutcome = "failed";
    try {
      const response = await postWithRetry(
        {
          url: `${baseUrl}/chat/completions`,
          headers: config.apiKey ? { authorization: `Bearer ${config.apiKey}` } : {},
          body: JSON.stringify({ model: config.model, ...body }),
        },
        {
          signal: options.signal,
          deadlineMs: options.deadlineMs,
          attemptTimeoutMs: config.callTimeoutMs,
          maxRetries,
          slot: (signal) => slots.acquire(options.party ?? NO_REQUEST_PARTY, signal),
        },
      );
      outcome = response.status < 300 ? "ok" : response.status < 500 ? "rejected" : "failed";
      return response;
    } catch (err) {
      if (err instanceof UpstreamError) {
        if (err.kind === "aborted") {
          outcome = "aborted";
          throw new LlmCallError("aborted", false);
        }
        if (err.kind === "timeout") outcome = "timeout";
        throw new LlmCallError(err.kind === "timeout" ? "timeout" : "upstream_error", true);
      }
      throw err;
    } finally {
      metrics?.recordLlmCall(outcome, (performance.now() - started) / 1000);
    }
  }

  async function probe(options: CallOptions): Promise<LlmCapabilities> {
    const caps: LlmCapabilities = {
      logprobs: true,
      topLogprobs: PREFERRED_TOP_LOGPROBS,
      maxTokensField: "max_tokens",
      thinkingSwitch: true,
      reasoningEffort: REASONING_EFFORTS[0],
      alwaysThinks: false,
      jsonSchema: false,
      sampling: true,
      systemRole: true,
    };
    for (let attempt = 0; attempt < MAX_PROBE_ATTEMPTS; attempt++) {
      const body: Record<string, unknown> = {
        messages: messagesFor(caps, PROBE_MESSAGES),
        [caps.maxTokensField]: caps.logprobs ? 1 : 16,
        ...(caps.sampling ? { temperature: 1, top_p: 1 } : {}),
        ...(caps.logprobs ? { logprobs: true, top_logprobs: caps.topLogprobs } : {}),
        ...thinkingOff(caps),
      };
      const response = await post(body, options, config.maxRetries);
      if (response.status >= 200 && response.status < 300) {
        const parsed = parseCompletion(response.text);
        // A 200 that is not a completion (an SSE stream, a proxy's page, no choices) says nothing about logprobs.
        if (!parsed) throw new LlmCallError("upstream_error", true, response.status);
        if (caps.logprobs) {
          const window = parsed.topLogprobs ?? [];
          // Accepted but empty (jundot/omlx#1549) or a one-entry window (a post-sampling report): unusable.
          if (window.length < 2) {
            caps.logprobs = false;
            continue;
          }
          // Thinking stayed on through every switch the server took: the first token is the reasoning, not the answer.
          if (isReasoningOpener(mostProbable(window)?.token)) {
            caps.logprobs = false;
            caps.alwaysThinks = true;
            logger.warn("the model opens with a reasoning token although thinking was switched off; asking on the verbalized path with a reasoning budget", {
              model: config.model,
              reasoning_budget_tokens: THINKING_BUDGET_TOKENS,
            });
            continue;
          }
          return caps;
        }
        return { ...caps, jsonSchema: await probeJsonSchema(caps, options) };
      }
      if (response.status === 401 || (response.status === 403 && !/logprob/i.test(response.text))) {
        throw new LlmCallError("upstream_error", false, response.status);
      }
      if (isRetryableStatus(response.status)) {
        throw new LlmCallError("upstream_error", true, response.status);
      }
      if (!adjustAfterRejection(caps, response.text)) break;
    }
    throw new LlmCallError("rejected", false);
  }

  async function probeJsonSchema(caps: LlmCapabilities, options: CallOptions): Promise<boolean> {
    const response = await post(
      {
        messages: messagesFor(caps, PROBE_MESSAGES),
        [caps.maxTokensField]: 32 + (caps.alwaysThinks ? THINKING_BUDGET_TOKENS : 0),
        ...thinkingOff(caps),
        response_format: jsonSchemaFormat({ type: "object", properties: { yes: { type: "number" } }, required: ["yes"], additionalProperties: false }),
      },
      options,
      config.maxRetries,
    );
    return response.status >= 200 && response.status < 300;
  }

  function capabilities(options: CallOptions): Promise<LlmCapabilities> {
    if (probed === undefined || now() >= probedUntil) {
      probedUntil = Infinity;
      // The probe runs on its own signal so that one caller going away does not fail it for the others.
      probed = probe({ signal: new AbortController().signal, deadlineMs: Date.now() + config.requestTimeoutMs }).then(
        (caps) => {
          probedUntil = now() + CAPABILITIES_TTL_MS;
          logger.info("llm capabilities probed", { ...caps });
          return caps;
        },
        (err: unknown) => {
          probedUntil = now() + PROBE_FAILURE_TTL_MS;
          logger.warn("llm capability probe failed; probing again later", { retry_in_ms: PROBE_FAILURE_TTL_MS, error: err instanceof Error ? err.message : String(err) });
          throw err;
        },
      );
      probed.catch(() => undefined);
    }
    return raceAbort(probed, options.signal);
  }

  return {
    capabilities,
    waitingCalls: () => slots.waiting(),

    async complete(request, options) {
      const caps = await capabilities(options);
      const common: Record<string, unknown> = {
        messages: messagesFor(caps, request.messages),
        ...thinkingOff(caps),
        ...(sendsCacheKey && request.cacheKey ? { prompt_cache_key: request.cacheKey } : {}),
      };
      const body: Record<string, unknown> =
        request.kind === "logprobs"
          ? { ...common, [caps.maxTokensField]: 1, ...(caps.sampling ? { temperature: 1, top_p: 1 } : {}), logprobs: true, top_logprobs: caps.topLogprobs }
          : {
              ...common,
              [caps.maxTokensField]: answerTokens(caps, request.maxTokens),
              ...(caps.jsonSchema ? { response_format: jsonSchemaFormat(request.schema) } : {}),
            };
      const response = await post(body, options, config.maxRetries);
      if (response.status < 200 || response.status >= 300) {
        logger.warn("llm call failed", { status: response.status, attempts: response.attempts });
        const retryable = isRetryableStatus(response.status);
        if (!retryable && ++rejectedInARow >= REPROBE_AFTER_REJECTIONS && probedUntil !== Infinity) {
          rejectedInARow = 0;
          probedUntil = 0;
          logger.info("llm calls refused in a row; probing capabilities again", { refused: REPROBE_AFTER_REJECTIONS });
        }
        throw new LlmCallError(retryable || response.status === 401 || response.status === 403 ? "upstream_error" : "rejected", retryable, response.status);
      }
      rejectedInARow = 0;
      const parsed = parseCompletion(response.text);
      if (!parsed) throw new LlmCallError("upstream_error", true, response.status);
      return parsed;
    },
  };
}

/** The fields that switch thinking off where the server takes them. */
function thinkingOff(caps: LlmCapabilities): Record<string, unknown> {
  return {
    ...(caps.thinkingSwitch ? { chat_template_kwargs: { enable_thinking: false } } : {}),
    ...(caps.reasoningEffort ? { reasoning_effort: caps.reasoningEffort } : {}),
  };
}

/**
 * The output budget of a verbalized call. A model that thinks anyway gets room
 * for its reasoning on top; OpenAI's reasoning models (max_completion_tokens)
 * count hidden reasoning tokens against it, so they get at least that much too.
 */
function answerTokens(caps: LlmCapabilities, answer: number): number {
  if (caps.alwaysThinks) return answer + THINKING_BUDGET_TOKENS;
  return caps.maxTokensField === "max_completion_tokens" ? Math.max(answer, THINKING_BUDGET_TOKENS) : answer;
}

/**
 * Changes one probe setting after a 4xx, reading the rejection only for the
 * name of the field it complains about. Returns false when nothing is left to
 * try. The text is inspected here and dropped; it is never logged.
 */
export function adjustAfterRejection(caps: LlmCapabilities, text: string): boolean {
  const said = text.toLowerCase();
  // OpenAI: "Unsupported value: 'reasoning_effort' does not support 'none' with this model. Supported values are:
  // 'minimal', 'low', 'medium', and 'high'." (recorded in Kilo-Org/cloud#3807); vLLM's pydantic error "Input should
  // be 'low', 'medium' or 'high'"; gpt-4o: "Unsupported parameter: 'reasoning_effort' ...". The lowest value offered, else none at all.
  if (caps.reasoningEffort !== undefined && /reasoning[_ .]?effort/.test(said)) {
    const current = caps.reasoningEffort;
    caps.reasoningEffort = REASONING_EFFORTS.find((effort) => effort !== current && new RegExp(`['"]${effort}['"]`).test(said));
    return true;
  }
  if (caps.thinkingSwitch && /chat_template_kwargs|enable_thinking/.test(said)) {
    caps.thinkingSwitch = false;
    return true;
  }
  if (caps.maxTokensField === "max_tokens" && said.includes("max_completion_tokens")) {
    caps.maxTokensField = "max_completion_tokens";
    return true;
  }
  // OpenAI's reasoning models: "Unsupported parameter: 'top_p' is not supported with this model." (same for temperature).
  if (caps.sampling && /\b(top_p|temperature)\b/.test(said) && /unsupported|not supported|does not support|not allowed/.test(said)) {
    caps.sampling = false;
    return true;
  }
  // Gemma 2 and Mistral v0.1 chat templates: raise_exception('System role not supported').
  if (caps.systemRole && /system (role|message)s? (is |are )?not supported/.test(said)) {
    caps.systemRole = false;
    return true;
  }
  // A cap on the window, named or not: vLLM "... greater than max allowed: 5", Fireworks "between 0 and 5", OpenAI "<= 20".
  const cap = said.includes("logprob") ? logprobCapIn(said) : undefined;
  if (caps.logprobs && cap !== undefined && cap >= 2 && cap < caps.topLogprobs) {
    caps.topLogprobs = cap;
    return true;
  }
  if (caps.logprobs && said.includes("logprob")) {
    caps.logprobs = false;
    return true;
  }
  // An unnamed complaint: drop the optional fields one at a time, the most exotic first.
  if (caps.reasoningEffort !== undefined) {
    caps.reasoningEffort = undefined;
    return true;
  }
  if (caps.thinkingSwitch) {
    caps.thinkingSwitch = false;
    return true;
  }
  if (caps.logprobs) {
    caps.logprobs = false;
    return true;
  }
  return false;
}

/** The largest window a rejection allows, read from its wording; undefined when it names none. */
export function logprobCapIn(said: string): number | undefined {
  const match = /(?:max(?:imum)? allowed:?|between 0 and|<=|less than or equal to|at most)\s*(\d+)/.exec(said);
  return match ? Number(match[1]) : undefined;
}

/** The messages as the template accepts them: without a system role, its text leads the first user message. */
function messagesFor(caps: LlmCapabilities, messages: ChatMessage[]): ChatMessage[] {
  if (caps.systemRole) return messages;
  const system = messages.filter((m) => m.role === "system").map((m) => m.content);
  const rest = messages.filter((m) => m.role !== "system");
  const firstUser = rest.findIndex((m) => m.role === "user");
  if (system.length === 0 || firstUser < 0) return rest;
  return rest.map((m, i) => (i === firstUser ? { role: "user", content: `${system.join("\n\n")}\n\n${m.content}` } : m));
}

function jsonSchemaFormat(schema: Record<string, unknown>): Record<string, unknown> {
  return { type: "json_schema", json_schema: { name: "distribution", strict: true, schema } };
}

/** Reads the parts of a chat completion we use; undefined when the body is not one. */
export function parseCompletion(text: string): ChatCompletion | undefined {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (!isRecord(json) || !Array.isArray(json.choices)) return undefined;
  const choice: unknown = json.choices[0];
  if (!isRecord(choice)) return undefined;
  const message = isRecord(choice.message) ? choice.message : {};
  const content = typeof message.content === "string" ? message.content : "";
  const refused = (typeof message.refusal === "string" && message.refusal !== "") || choice.finish_reason === "content_filter";
  let firstToken: TokenLogprob | undefined;
  let topLogprobs: TokenLogprob[] | undefined;
  const logprobs = isRecord(choice.logprobs) ? choice.logprobs : undefined;
  const first: unknown = Array.isArray(logprobs?.content) ? logprobs.content[0] : undefined;
  if (isRecord(first)) {
    firstToken = toTokenLogprob(first);
    topLogprobs = Array.isArray(first.top_logprobs) ? first.top_logprobs.map(toTokenLogprob).filter((t) => t !== undefined) : [];
  }
  return { content, firstToken, topLogprobs, usage: readUsage(json), refused };
}

function toTokenLogprob(value: unknown): TokenLogprob | undefined {
  if (!isRecord(value) || typeof value.token !== "string") return undefined;
  const logprob = typeof value.logprob === "number" ? value.logprob : Number.NEGATIVE_INFINITY;
  return { token: value.token, logprob };
}

/**
 * Usage with the known quirks folded in: `prompt_tokens` includes cached
 * tokens on OpenAI, xAI and current llama.cpp, but older llama-server counts
 * only new tokens and reports the cached ones as `timings.cache_n`
 * (ollama/ollama#16414), and some servers report a cached count larger than
 * the prompt count, which means it was excluded.
 */
export function readUsage(json: Record<string, unknown>): ChatUsage | undefined {
  const usage = isRecord(json.usage) ? json.usage : undefined;
  const promptTokens = count(usage?.prompt_tokens);
  if (!usage || promptTokens === undefined) return undefined;
  const details = isRecord(usage.prompt_tokens_details) ? usage.prompt_tokens_details : undefined;
  let cachedTokens = count(details?.cached_tokens);
  let total = promptTokens;
  const timings = isRecord(json.timings) ? json.timings : undefined;
  const cacheN = count(timings?.cache_n);
  if (cachedTokens === undefined && cacheN !== undefined && cacheN > 0) {
    cachedTokens = cacheN;
    if (count(timings?.prompt_n) === promptTokens) total = promptTokens + cacheN;
  }
  cachedTokens ??= 0;
  if (cachedTokens > total) total += cachedTokens;
  return { promptTokens: total, cachedTokens, completionTokens: count(usage.completion_tokens) ?? 0 };
}

function count(value: unknown): number | undefined {
  return typeof value === "number" && Number.isInteger(value) && value >= 0 ? value : undefined;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Settles with `promise`, or rejects as aborted as soon as `signal` fires. */
function raceAbort<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(new LlmCallError("aborted", false));
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(new LlmCallError("aborted", false));
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener("abort", onAbort);
        resolve(value);
      },
      (err: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(err);
      },
    );
  });
}
