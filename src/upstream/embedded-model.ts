import type { ChatHistoryItem, LlamaContext, LlamaContextSequence, LlamaModel, Token } from "node-llama-cpp";
import type { Logger } from "../logger.js";
import { createFairSemaphore } from "./fair-semaphore.js";
import {
  LlmCallError,
  type CallOptions,
  type ChatMessage,
  type LabelScoreRequest,
  type LabelScores,
  type LlmCapabilities,
  type LlmClient,
} from "./llm-client.js";

/**
 * A GGUF model run in this process through node-llama-cpp (llama.cpp's
 * prebuilt CPU binary), read as a scorer: the prompt goes through the model's
 * own chat template, and each label's probability is read from the whole
 * next-token distribution, continuations included. One context holds a
 * bounded number of sequences; calls take a sequence through a fair queue,
 * preferring the one that already holds the longest part of their prompt, so
 * the questions of one request evaluate the shared prefix once.
 */

export interface EmbeddedModelSettings {
  /** Tokens each sequence holds: the longest prompt one question may have. */
  contextTokens: number;
  /** Sequences evaluated side by side (each holds its own cache of `contextTokens`). */
  sequences: number;
  /** CPU threads llama.cpp uses; 0 lets it choose. */
  threads: number;
}

/** The loaded model as a client of the decision engine, and what the health report shows. */
export interface EmbeddedModel extends LlmClient {
  scoreLabels(request: LabelScoreRequest, options: CallOptions): Promise<LabelScores>;
  /** The prompt's tokens under the model's chat template, as metering counts them. */
  promptTokens(messages: readonly ChatMessage[]): Token[];
  describe(): { file: string; contextTokens: number; sequences: number };
  /** Tokens run through llama.cpp since the model loaded: what a call really cost the engine. */
  tokensEvaluated(): number;
  dispose(): Promise<void>;
}

/** Prompt tokens evaluated between two looks at the call's signal, so a cancelled call stops soon. */
const EVALUATION_CHUNK_TOKENS = 512;

/** Loads `file` and opens its context; throws when the file is not a model llama.cpp can load. */
export async function loadEmbeddedModel(file: string, settings: EmbeddedModelSettings, logger: Logger): Promise<EmbeddedModel> {
  const { getLlama, LlamaLogLevel, JinjaTemplateChatWrapper, resolveChatWrapper } = await import("node-llama-cpp");
  const llama = await getLlama({
    // The CPU build only: the install leaves the GPU packages out, and nothing may be built or downloaded at run time.
    gpu: false,
    build: "never",
    progressLogs: false,
    logLevel: LlamaLogLevel.error,
    logger: (level, message) => {
      if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) logger.warn("embedded model engine", { message: message.trim() });
    },
  });
  const model = await llama.loadModel({ modelPath: file });
  let context: LlamaContext;
  try {
    context = await model.createContext({
      contextSize: settings.contextTokens * settings.sequences,
      sequences: settings.sequences,
      ...(settings.threads > 0 ? { threads: settings.threads } : {}),
    });
  } catch (err) {
    await model.dispose();
    throw err;
  }
  const template = model.fileInfo.metadata.tokenizer.chat_template;
  const chatWrapper =
    typeof template === "string" && template !== ""
      ? new JinjaTemplateChatWrapper({ template, tokenizer: model.tokenizer })
      : resolveChatWrapper(model);
  const sequences: LlamaContextSequence[] = Array.from({ length: settings.sequences }, () => context.getSequence());
  const free = new Set(sequences);
  const slots = createFairSemaphore(settings.sequences);
  const noParty = {};
  let evaluated = 0;

  function promptTokens(messages: readonly ChatMessage[]): Token[] {
    const chatHistory: ChatHistoryItem[] = messages.map((m) =>
      m.role === "system" ? { type: "system", text: m.content } : m.role === "user" ? { type: "user", text: m.content } : { type: "model", response: [m.content] },
    );
    chatHistory.push({ type: "model", response: [] });
    return chatWrapper.generateContextState({ chatHistory }).contextText.tokenize(model.tokenizer);
  }

  /** The token sequences of each label, without any that another of the same label already covers (a prefix of it). */
  function labelTokens(spellings: readonly (readonly string[])[]): Token[][][] {
    return spellings.map((variants) => {
      const all = [...new Map(variants.map((v) => model.tokenize(v, false)).filter((t) => t.length > 0).map((t) => [t.join(","), t])).values()];
      return all.filter((t) => !all.some((o) => o !== t && o.length < t.length && o.every((tok, i) => t[i] === tok)));
    });
  }

  async function takeSequence(prompt: readonly Token[], options: CallOptions): Promise<{ sequence: LlamaContextSequence; release: () => void }> {
    const release = await slots.acquire(options.party ?? noParty, options.signal);
    if (!release) throw new LlmCallError("aborted", false);
    let best: LlamaContextSequence | undefined;
    let bestShared = -1;
    for (const sequence of free) {
      const shared = sequence.compareContextTokens([...prompt]).firstDifferentIndex;
      if (shared > bestShared) [best, bestShared] = [sequence, shared];
    }
    free.delete(best!);
    return {
      sequence: best!,
      release: () => {
        free.add(best!);
        release();
      },
    };
  }

  function throwIfAborted(signal: AbortSignal) {
    if (signal.aborted) throw new LlmCallError("aborted", false);
  }

  /** Probabilities of `tokens` as the next token: exp(logit − max) over the whole vocabulary's sum. */
  function nextProbabilities(next: { logits?: Map<Token, number>; totalLogitWeight?: number }): (token: Token) => number {
    const logits = next.logits!;
    const max = Math.max(...logits.values());
    const total = next.totalLogitWeight!;
    return (token) => Math.exp(logits.get(token)! - max) / total;
  }

  async function score(sequence: LlamaContextSequence, prompt: Token[], labels: Token[][][], signal: AbortSignal) {
    // At least the prompt's last token is evaluated again: its output is the distribution read.
    const kept = Math.min(sequence.compareContextTokens(prompt).firstDifferentIndex, prompt.length - 1);
    if (kept < sequence.nextTokenIndex) await sequence.eraseContextTokenRanges([{ start: kept, end: sequence.nextTokenIndex }]);
    // The last chunk goes in with the read position, so a prompt that fits one chunk is one batch.
    let at = kept;
    for (; prompt.length - at > EVALUATION_CHUNK_TOKENS; at += EVALUATION_CHUNK_TOKENS) {
      throwIfAborted(signal);
      evaluated += EVALUATION_CHUNK_TOKENS;
      await sequence.evaluateWithoutGeneratingNewTokens(prompt.slice(at, at + EVALUATION_CHUNK_TOKENS));
    }
    throwIfAborted(signal);
    const firsts = [...new Set(labels.flat().map((t) => t[0]!))];
    const rest = prompt.slice(at);
    evaluated += rest.length;
    const outputs = await sequence.controlledEvaluate([
      ...rest.slice(0, -1),
      // includeTop: 1 brings the largest logit, which the probabilities are relative to.
      [rest.at(-1)!, { generateNext: { logits: { filter: { tokens: firsts, includeTop: 1 } }, totalLogitWeight: true } }],
    ]);
    const first = nextProbabilities(outputs.at(-1)!.next);
    const probabilities: number[] = [];
    for (const variants of labels) {
      let p = 0;
      for (const tokens of variants) p += first(tokens[0]!) * (tokens.length > 1 ? await continuation(sequence, prompt.length, tokens, signal) : 1);
      probabilities.push(p);
    }
    return { probabilities, cached: kept };
  }

  /** P(tokens[1..] | prompt, tokens[0]), evaluated after the prompt and then erased again. */
  async function continuation(sequence: LlamaContextSequence, promptLength: number, tokens: Token[], signal: AbortSignal): Promise<number> {
    throwIfAborted(signal);
    const head = tokens.slice(0, -1);
    evaluated += head.length;
    try {
      const outputs = await sequence.controlledEvaluate(
        head.map((token, i) => [token, { generateNext: { logits: { filter: { tokens: [tokens[i + 1]!], includeTop: 1 } }, totalLogitWeight: true } }]),
      );
      return head.reduce((p, _t, i) => p * nextProbabilities(outputs[i]!.next)(tokens[i + 1]!), 1);
    } finally {
      await sequence.eraseContextTokenRanges([{ start: promptLength, end: sequence.nextTokenIndex }]);
    }
  }

  return {
    async capabilities(): Promise<LlmCapabilities> {
      return {
        logprobs: true,
        topLogprobs: Number.MAX_SAFE_INTEGER,
        maxTokensField: "max_tokens",
        thinkingSwitch: false,
        reasoningEffort: undefined,
        alwaysThinks: false,
        jsonSchema: false,
        sampling: true,
        systemRole: true,
      };
    },
    async complete() {
      // The engine reads every answer through scoreLabels; text generation is not offered.
      throw new LlmCallError("rejected", false);
    },
    waitingCalls: () => slots.waiting(),
    promptTokens,
    async scoreLabels(request, options) {
      const prompt = promptTokens(request.messages);
      if (prompt.length + 8 > settings.contextTokens) throw new LlmCallError("rejected", false);
      const labels = labelTokens(request.spellings);
      const { sequence, release } = await takeSequence(prompt, options);
      try {
        const { probabilities, cached } = await score(sequence, prompt, labels, options.signal);
        return { probabilities, usage: { promptTokens: prompt.length, cachedTokens: cached, completionTokens: 1 } };
      } catch (err) {
        if (err instanceof LlmCallError) throw err;
        logger.warn("embedded model evaluation failed", { err: err instanceof Error ? err : String(err) });
        // A sequence in an unknown state starts over.
        await sequence.clearHistory().catch(() => {});
        throw new LlmCallError("upstream_error", true);
      } finally {
        release();
      }
    },
    describe: () => ({ file, contextTokens: settings.contextTokens, sequences: settings.sequences }),
    tokensEvaluated: () => evaluated,
    async dispose() {
      await context.dispose();
      await model.dispose();
    },
  };
}
