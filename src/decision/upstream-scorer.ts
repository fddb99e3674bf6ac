import crypto from "node:crypto";
import type { ChatCompletion, LlmClient } from "../upstream/llm-client.js";
import { isReasoningOpener, mostProbable } from "../upstream/logprob-window.js";
import type { CallOptions, ChatMessage, ChatUsage } from "../upstream/model-call.js";
import { firstPositionWindow, readLabelDistribution } from "./answer-math.js";
import { NoSignal, Refused, type LabelReader, type LabelScorer, type Readout } from "./label-scorer.js";
import type { LabelSet } from "./labels.js";
import { buildMessages, estimateTokens, VERBALIZED_FEEDBACK, type QuestionBlock } from "./prompt.js";

/** Retries with feedback after a stated reply that is not the JSON asked for (not billed). */
const VERBALIZED_FORMAT_RETRIES = 2;

/**
 * Labels read from an OpenAI-compatible server, one chat completion per read.
 * With logprobs: the first position's top-k window, read over the labels'
 * spellings; a reply that opens a reasoning block or holds no label is asked
 * once more with the closing line repeated. Without them: the model states a
 * JSON distribution, with feedback when the reply is not one. The client
 * (llm-client.ts) owns the probe, the request fields, the retries and the slots.
 */
export function createUpstreamScorer(llm: LlmClient): LabelScorer {
  return {
    async begin(stateBlock: string, options: CallOptions): Promise<LabelReader> {
      const caps = await llm.capabilities(options);
      // OpenAI routes calls with one key to one prompt cache; every question of a request shares the state.
      const cacheKey = crypto.createHash("sha256").update(stateBlock).digest("hex").slice(0, 32);
      if (!caps.logprobs) {
        return { kind: "verbalized", state: (block, symbols) => stated(llm, buildMessages(stateBlock, block.text), symbols, cacheKey, options) };
      }
      return {
        kind: "distribution",
        labelsPerRead: caps.topLogprobs,
        read: (block, labels) => windowReadout(llm, stateBlock, block, labels, cacheKey, options),
      };
    },
  };
}

/** One logprobs call, read over `labels`; once more with the closing line repeated if no label came back. */
async function windowReadout(llm: LlmClient, stateBlock: string, block: QuestionBlock, labels: LabelSet, cacheKey: string, options: CallOptions): Promise<Readout> {
  for (const messages of [buildMessages(stateBlock, block.text), buildMessages(stateBlock, `${block.text}\n${block.closing}`)]) {
    const completion = await llm.complete({ kind: "logprobs", messages, cacheKey }, options);
    if (completion.refused) throw new Refused();
    const window = firstPositionWindow(completion.topLogprobs, completion.firstToken);
    if (isReasoningOpener(mostProbable(window)?.token)) continue;
    const distribution = readLabelDistribution(window, labels, completion.topLogprobs ?? []);
    if (distribution.mass > 0) return { distribution, usage: usageOf(completion, messages) };
  }
  throw new NoSignal();
}

/** The distribution the reply states over `symbols`, asked again with feedback when the reply is not the JSON asked for. */
async function stated(
  llm: LlmClient,
  first: ChatMessage[],
  symbols: readonly string[],
  cacheKey: string,
  options: CallOptions,
): Promise<{ probabilities: number[]; usage: ChatUsage }> {
  const schema = {
    type: "object",
    properties: Object.fromEntries(symbols.map((s) => [s, { type: "number" }])),
    required: [...symbols],
    additionalProperties: false,
  };
  let messages = first;
  for (let attempt = 0; attempt <= VERBALIZED_FORMAT_RETRIES; attempt++) {
    const completion = await llm.complete({ kind: "json", messages, schema, maxTokens: 16 + 12 * symbols.length, cacheKey }, options);
    if (completion.refused) throw new Refused();
    const probabilities = parseVerbalized(completion.content, symbols);
    if (probabilities) return { probabilities, usage: usageOf(completion, messages) };
    messages = [...messages, { role: "assistant", content: completion.content.slice(0, 2_000) }, { role: "user", content: VERBALIZED_FEEDBACK }];
  }
  throw new NoSignal();
}

/**
 * A stated distribution: a JSON object (possibly inside other text) with a
 * non-negative number for every symbol, normalized; undefined otherwise.
 */
export function parseVerbalized(content: string, symbols: readonly string[]): number[] | undefined {
  const text = withoutReasoning(content).trim();
  const start = text.indexOf("{");
  const end = text.lastIndexOf("}");
  if (start < 0 || end <= start) return undefined;
  let json: unknown;
  try {
    json = JSON.parse(text.slice(start, end + 1));
  } catch {
    return undefined;
  }
  if (typeof json !== "object" || json === null || Array.isArray(json)) return undefined;
  const entries = new Map(Object.entries(json).map(([k, v]) => [k.trim().toLowerCase(), v]));
  const values: number[] = [];
  for (const symbol of symbols) {
    const value: unknown = (json as Record<string, unknown>)[symbol] ?? entries.get(symbol.toLowerCase());
    if (typeof value !== "number" || !Number.isFinite(value) || value < 0) return undefined;
    values.push(value);
  }
  const sum = values.reduce((a, b) => a + b, 0);
  if (!(sum > 0)) return undefined;
  return values.map((v) => v / sum);
}

/**
 * The answer part of a reply from a model that reasons in its content: what
 * follows the last `</think>` (DeepSeek-R1, Qwen3 without a reasoning parser)
 * or the final channel of gpt-oss's harmony format; nothing when the
 * reasoning never closed (the budget ran out).
 */
export function withoutReasoning(content: string): string {
  const closed = content.toLowerCase().lastIndexOf(THINK_CLOSE);
  if (closed >= 0) return content.slice(closed + THINK_CLOSE.length);
  const final = content.lastIndexOf(HARMONY_FINAL);
  if (final >= 0) return content.slice(final + HARMONY_FINAL.length);
  return /^\s*(<think>|<\|channel\|>)/i.test(content) ? "" : content;
}
const THINK_CLOSE = "</think>";
const HARMONY_FINAL = "<|channel|>final<|message|>";

/** The usage a call reported, or an estimate from its prompt when it reported none. */
function usageOf(completion: ChatCompletion, messages: readonly ChatMessage[]): ChatUsage {
  return completion.usage ?? { promptTokens: estimateTokens(messages), cachedTokens: 0, completionTokens: 1 };
}
