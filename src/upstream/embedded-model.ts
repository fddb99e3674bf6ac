import type { ChatHistoryItem, LlamaContext, LlamaContextSequence, LlamaModel, Token } from "node-llama-cpp";
import type { Logger } from "../logger.js";
import { createFairSemaphore } from "./fair-semaphore.js";
import type { ModelPace } from "./model-pace.js";
import { LlmCallError, type CallOptions, type ChatMessage, type ChatUsage } from "./model-call.js";

/**
 * A GGUF model run in this process through node-llama-cpp (llama.cpp's
 * prebuilt CPU binary), read as a scorer: the prompt goes through the model's
 * own chat template, and each label's probability is read from the whole
 * next-token distribution, continuations included. One context holds a
 * bounded number of sequences; calls take a sequence through a fair queue,
 * preferring the one that already holds the longest part of their prompt.
 * When another sequence holds (or is evaluating) a longer part, its cache is
 * copied rather than evaluated again, so the questions of one request evaluate
 * their shared prefix once whatever sequence each lands on. The labels'
 * spellings form a trie: spellings that share first tokens are read from one
 * evaluation of the shared part, and one branch of continuations goes in the
 * same batch as the prompt's last tokens.
 *
 * The shared sequences are sized for the prompts decisions usually have, not
 * for the longest one allowed: each holds its own cache (llama.cpp keeps one
 * per sequence), and that cache is most of the memory beside the weights. A
 * prompt too long for them gets a context of its own, sized for the
 * per-question limit, made when such a prompt comes and freed when the last
 * one is answered.
 */

export interface EmbeddedModelSettings {
  /** The longest prompt one question may have, in tokens. */
  contextTokens: number;
  /** Sequences evaluated side by side (each holds its own cache of up to `SHARED_SEQUENCE_TOKENS`). */
  sequences: number;
  /** CPU threads llama.cpp uses; 0: the machine's physical cores. */
  threads: number;
  /** Hears of each evaluation: when it ran and the prompt tokens it evaluated. */
  pace?: Pick<ModelPace, "evaluating">;
}

export interface LabelScoreRequest {
  messages: ChatMessage[];
  /** Per label, the spellings that count as it; their probabilities are summed. */
  spellings: readonly (readonly string[])[];
}

export interface LabelScores {
  /** Per label, the probability that the reply starts with one of its spellings (not renormalized). */
  probabilities: number[];
  usage: ChatUsage;
}

/**
 * The loaded model: a scorer of labels over its whole vocabulary (not a chat
 * client: it generates no text), and what the health report and the deadline
 * of a call read from it.
 */
export interface EmbeddedModel {
  /** The probability that the reply starts with each label, exact: read from the whole next-token distribution. */
  scoreLabels(request: LabelScoreRequest, options: CallOptions): Promise<LabelScores>;
  /** The prompt's tokens under the model's chat template, as metering counts them. */
  promptTokens(messages: readonly ChatMessage[]): Token[];
  describe(): { file: string; contextTokens: number; sequences: number };
  /** Tokens run through llama.cpp since the model loaded: what a call really cost the engine. */
  tokensEvaluated(): number;
  dispose(): Promise<void>;
}

/**
 * Tokens each shared sequence holds (or `contextTokens`, when smaller): room
 * for a state of several thousand characters and its question. A longer prompt
 * is evaluated in a context of its own.
 */
export const SHARED_SEQUENCE_TOKENS = 2_048;
/** Prompt tokens evaluated between two looks at the call's signal, so a cancelled call stops soon. */
const EVALUATION_CHUNK_TOKENS = 512;
/** A cache copy (a memory copy of one sequence) pays when it saves more than this many tokens of evaluation. */
const COPY_MIN_TOKENS = 16;

/** A node of the labels' trie: the token paths of every spelling, with the labels each path ends. */
interface LabelNode {
  children: Map<Token, LabelNode>;
  /** Labels a spelling ending here counts for. */
  ends: number[];
}

/** Tokens two lists share from their start. */
function sharedLength(a: readonly Token[], b: readonly Token[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/** What node-llama-cpp keeps internal in its pinned version: copying one sequence's cache into another. */
interface CopyableSequence {
  _copyStateFromOtherSequence(other: LlamaContextSequence, upToTokenIndex: number): Promise<boolean>;
}

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
  // Read into memory rather than mapped: llama.cpp repacks some weights for the CPU's kernels into memory of its own,
  // and with a mapping those pages of the file stay resident beside that copy.
  const model = await llama.loadModel({ modelPath: file, useMmap: false });
  const threads = settings.threads > 0 ? settings.threads : llama.cpuMathCores;
  const sharedTokens = Math.min(settings.contextTokens, SHARED_SEQUENCE_TOKENS);
  let context: LlamaContext;
  try {
    context = await model.createContext({
      // node-llama-cpp gives each sequence a cache of its own of `contextSize` cells (llama.cpp's KV streams).
      contextSize: sharedTokens,
      sequences: settings.sequences,
      threads,
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
  /** The context for prompts longer than a shared sequence holds: one at a time, freed when none waits. */
  const longSlots = createFairSemaphore(1);
  let long: { context: LlamaContext; sequence: LlamaContextSequence } | undefined;
  const noParty = {};
  let evaluated = 0;

  function promptTokens(messages: readonly ChatMessage[]): Token[] {
    const chatHistory: ChatHistoryItem[] = messages.map((m) =>
      m.role === "system" ? { type: "system", text: m.content } : m.role === "user" ? { type: "user", text: m.content } : { type: "model", response: [m.content] },
    );
    chatHistory.push({ type: "model", response: [] });
    return chatWrapper.generateContextState({ chatHistory }).contextText.tokenize(model.tokenizer);
  }

  /** The trie of the labels' spellings, without a spelling that another of the same label already covers (a prefix of it). */
  function labelTrie(spellings: readonly (readonly string[])[]): LabelNode {
    const root: LabelNode = { children: new Map(), ends: [] };
    spellings.forEach((variants, label) => {
      const all = [...new Map(variants.map((v) => model.tokenize(v, false)).filter((t) => t.length > 0).map((t) => [t.join(","), t])).values()];
      for (const tokens of all) {
        if (all.some((o) => o !== tokens && o.length < tokens.length && o.every((tok, i) => tokens[i] === tok))) continue;
        let node = root;
        for (const token of tokens) {
          let child = node.children.get(token);
          if (!child) node.children.set(token, (child = { children: new Map(), ends: [] }));
          node = child;
        }
        node.ends.push(label);
      }
    });
    return root;
  }

  /** Per sequence, the prompt of the call evaluating on it and when that evaluation is done. */
  const inFlight = new Map<LlamaContextSequence, { prompt: readonly Token[]; evaluated: Promise<void> }>();
  /** Per sequence, the copies of its cache that calls on other sequences are waiting to make. */
  const copiesFrom = new Map<LlamaContextSequence, Set<Promise<void>>>();

  /**
   * A sequence for `prompt`, registered at once as evaluating it (so that the
   * next question of the request finds it even before the evaluation starts);
   * `evaluated` is to be called when the evaluation is over, however it ended.
   */
  async function takeSequence(
    prompt: readonly Token[],
    options: CallOptions,
  ): Promise<{ sequence: LlamaContextSequence; evaluated: () => void; release: () => void }> {
    const release = await slots.acquire(options.party ?? noParty, options.signal);
    if (!release) throw new LlmCallError("aborted", false);
    let best: LlamaContextSequence | undefined;
    let bestShared = -1;
    for (const sequence of free) {
      const shared = sequence.compareContextTokens(prompt as Token[]).firstDifferentIndex;
      if (shared > bestShared) [best, bestShared] = [sequence, shared];
    }
    const sequence = best!;
    free.delete(sequence);
    let evaluated!: () => void;
    const mine = { prompt, evaluated: new Promise<void>((resolve) => (evaluated = resolve)) };
    const taken = {
      sequence,
      evaluated,
      release: () => {
        evaluated();
        if (inFlight.get(sequence) === mine) inFlight.delete(sequence);
        const giveBack = () => {
          free.add(sequence);
          release();
        };
        // Nobody evaluates on a sequence while its cache is being copied: it waits for the copies taken from it.
        const copies = copiesFrom.get(sequence);
        if (copies?.size) void Promise.all(copies).then(giveBack);
        else giveBack();
      },
    };
    // A busy sequence that holds or is evaluating more of this prompt: wait for it and copy its cache.
    let donor: LlamaContextSequence | undefined;
    let donorShared = bestShared + COPY_MIN_TOKENS;
    for (const [other, work] of inFlight) {
      const shared = Math.max(sharedLength(work.prompt, prompt), other.compareContextTokens(prompt as Token[]).firstDifferentIndex);
      if (shared > donorShared) [donor, donorShared] = [other, shared];
    }
    inFlight.set(sequence, mine);
    if (donor) {
      let copied!: () => void;
      const copy = new Promise<void>((resolve) => (copied = resolve));
      const copies = copiesFrom.get(donor) ?? new Set<Promise<void>>();
      copiesFrom.set(donor, copies.add(copy));
      try {
        const donorEvaluated = inFlight.get(donor)!.evaluated;
        // A cancelled call stops waiting at once.
        await new Promise<void>((resolve) => {
          const stop = () => {
            options.signal.removeEventListener("abort", stop);
            resolve();
          };
          if (options.signal.aborted) return stop();
          options.signal.addEventListener("abort", stop, { once: true });
          void donorEvaluated.then(stop);
        });
        throwIfAborted(options.signal);
        const shared = donor.compareContextTokens(prompt as Token[]).firstDifferentIndex;
        if (shared > bestShared + COPY_MIN_TOKENS) {
          const done = await (sequence as unknown as CopyableSequence)._copyStateFromOtherSequence(donor, shared).catch(() => false);
          // A copy that failed or did not end where asked leaves the sequence in doubt: it starts over.
          if (!done) await sequence.clearHistory();
        }
      } catch (err) {
        taken.release();
        throw err;
      } finally {
        copies.delete(copy);
        copied();
      }
    }
    return taken;
  }

  function throwIfAborted(signal: AbortSignal) {
    if (signal.aborted) throw new LlmCallError("aborted", false);
  }

  /** The long prompts' sequence, in a context made for it; the last call to give it back frees the context's memory. */
  async function takeLongSequence(options: CallOptions): Promise<{ sequence: LlamaContextSequence; evaluated: () => void; release: () => void }> {
    const release = await longSlots.acquire(options.party ?? noParty, options.signal);
    if (!release) throw new LlmCallError("aborted", false);
    try {
      if (!long) {
        const longContext = await model.createContext({ contextSize: settings.contextTokens, sequences: 1, threads });
        long = { context: longContext, sequence: longContext.getSequence() };
      }
    } catch (err) {
      release();
      throw err;
    }
    return {
      sequence: long.sequence,
      evaluated: () => {},
      release: () => {
        const held = long;
        if (longSlots.waiting() > 0 || !held) return release();
        long = undefined;
        void held.context.dispose().finally(release);
      },
    };
  }

  /** Reads at a position: the logits of `tokens` and the largest, over the whole vocabulary's sum. */
  const readOf = (tokens: Iterable<Token>) => ({ generateNext: { logits: { filter: { tokens: [...tokens], includeTop: 1 } }, totalLogitWeight: true } }) as const;

  /** Probabilities of tokens as the next token: exp(logit − max) over the whole vocabulary's sum. */
  function nextProbabilities(next: { logits?: Map<Token, number>; totalLogitWeight?: number }): (token: Token) => number {
    const logits = next.logits!;
    let max = -Infinity;
    for (const logit of logits.values()) if (logit > max) max = logit;
    const total = next.totalLogitWeight!;
    return (token) => Math.exp(logits.get(token)! - max) / total;
  }

  /** The trie's inner nodes below the root as chains: each chain is one path of tokens, read at each step. */
  function chains(root: LabelNode): Array<Array<{ token: Token; node: LabelNode }>> {
    const result: Array<Array<{ token: Token; node: LabelNode }>> = [];
    const walk = (node: LabelNode, path: Array<{ token: Token; node: LabelNode }>) => {
      let extended = false;
      for (const [token, child] of node.children) {
        if (child.children.size === 0) continue;
        if (!extended) {
          walk(child, [...path, { token, node: child }]);
          extended = true;
        } else walk(child, [{ token, node: child }]);
      }
      if (!extended && path.length > 0) result.push(path);
    };
    walk(root, []);
    return result;
  }

  async function score(sequence: LlamaContextSequence, prompt: Token[], trie: LabelNode, labelCount: number, signal: AbortSignal) {
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
    // Where each inner node of the trie is read: the root after the prompt, the others after their path.
    const reads = new Map<LabelNode, (token: Token) => number>();
    const [first, ...others] = chains(trie);
    // Whole chains are evaluated in one go, so a chain's paths must come from the root: later chains restart from their own root-side path.
    const pathTo = (chain: Array<{ token: Token; node: LabelNode }>) => {
      const path: Token[] = [];
      const target = chain[0]!.node;
      const find = (node: LabelNode, trail: Token[]): boolean => {
        for (const [token, child] of node.children) {
          if (child === target) {
            path.push(...trail, token);
            return true;
          }
          if (find(child, [...trail, token])) return true;
        }
        return false;
      };
      find(trie, []);
      return path;
    };
    const rest = prompt.slice(at);
    const head = first ? pathTo(first).slice(0, -1) : [];
    const firstChain = first ?? [];
    const items = [
      ...rest.slice(0, -1),
      [rest.at(-1)!, readOf(trie.children.keys())],
      ...head,
      ...firstChain.map(({ token, node }) => [token, readOf(node.children.keys())] as const),
    ] as Parameters<LlamaContextSequence["controlledEvaluate"]>[0];
    evaluated += items.length;
    const outputs = await sequence.controlledEvaluate(items);
    reads.set(trie, nextProbabilities(outputs[rest.length - 1]!.next));
    firstChain.forEach(({ node }, i) => reads.set(node, nextProbabilities(outputs[rest.length + head.length + i]!.next)));
    for (const chain of others) {
      throwIfAborted(signal);
      // Each further branch after the prompt, in place of the one before.
      await sequence.eraseContextTokenRanges([{ start: prompt.length, end: sequence.nextTokenIndex }]);
      const lead = pathTo(chain).slice(0, -1);
      const branch = [...lead, ...chain.map(({ token, node }) => [token, readOf(node.children.keys())] as const)] as Parameters<LlamaContextSequence["controlledEvaluate"]>[0];
      evaluated += branch.length;
      const branchOutputs = await sequence.controlledEvaluate(branch);
      chain.forEach(({ node }, i) => reads.set(node, nextProbabilities(branchOutputs[lead.length + i]!.next)));
    }
    const probabilities = new Array<number>(labelCount).fill(0);
    const sum = (node: LabelNode, p: number) => {
      for (const label of node.ends) probabilities[label]! += p;
      if (node.children.size === 0) return;
      const read = reads.get(node)!;
      for (const [token, child] of node.children) sum(child, p * read(token));
    };
    sum(trie, 1);
    return { probabilities, cached: kept };
  }

  return {
    promptTokens,
    async scoreLabels(request, options) {
      const prompt = promptTokens(request.messages);
      if (prompt.length + 8 > settings.contextTokens) throw new LlmCallError("rejected", false);
      const trie = labelTrie(request.spellings);
      const { sequence, evaluated: done, release } = prompt.length + 8 > sharedTokens ? await takeLongSequence(options) : await takeSequence(prompt, options);
      const evaluated = settings.pace?.evaluating();
      let evaluatedTokens = 0;
      try {
        const { probabilities, cached } = await score(sequence, prompt, trie, request.spellings.length, options.signal).finally(done);
        evaluatedTokens = prompt.length - cached;
        return { probabilities, usage: { promptTokens: prompt.length, cachedTokens: cached, completionTokens: 1 } };
      } catch (err) {
        if (err instanceof LlmCallError) throw err;
        logger.warn("embedded model evaluation failed", { err: err instanceof Error ? err : String(err) });
        // A sequence in an unknown state starts over.
        await sequence.clearHistory().catch(() => {});
        throw new LlmCallError("upstream_error", true);
      } finally {
        evaluated?.(evaluatedTokens);
        release();
      }
    },
    describe: () => ({ file, contextTokens: settings.contextTokens, sequences: settings.sequences }),
    tokensEvaluated: () => evaluated,
    async dispose() {
      await long?.context.dispose();
      await context.dispose();
      await model.dispose();
    },
  };
}
