import { getLlama, LlamaLogLevel, type LlamaModel, type Token } from "node-llama-cpp";
import type { ChatMessage } from "../../src/upstream/model-call.js";

/**
 * The reference the embedded path is checked against: the same GGUF loaded
 * a second time, the ChatML prompt written out by hand, and each label's
 * probability taken from node-llama-cpp's own full distribution
 * (`probabilities` of each position), one fresh evaluation per spelling. Nothing of the service's scorer is used.
 */
export interface Reference {
  /** Per label, the probability that the reply starts with one of its spellings. */
  labelProbabilities(messages: readonly ChatMessage[], spellings: readonly (readonly string[])[]): Promise<number[]>;
  tokenize(text: string): Token[];
  /** The prompt's tokens under the handwritten ChatML template. */
  tokenizeChat(messages: readonly ChatMessage[]): Token[];
  close(): Promise<void>;
}

export async function openReference(file: string): Promise<Reference> {
  const llama = await getLlama({ gpu: false, build: "never", progressLogs: false, logLevel: LlamaLogLevel.error });
  const model: LlamaModel = await llama.loadModel({ modelPath: file });
  const context = await model.createContext({ contextSize: 4096, sequences: 1, threads: 1 });
  const sequence = context.getSequence();

  /** The full next-token distribution after each of `tokens` from index `from` on, from an empty sequence. */
  async function distributions(tokens: Token[], from: number): Promise<Array<Map<Token, number>>> {
    await sequence.clearHistory();
    const outputs = await sequence.controlledEvaluate(tokens.map((t, i) => (i >= from ? [t, { generateNext: { probabilities: true } }] : t)));
    return outputs.slice(from).map((o) => o!.next.probabilities!);
  }

  const tokenizeChat = (messages: readonly ChatMessage[]) =>
    model.tokenize(messages.map((m) => `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`).join("") + "<|im_start|>assistant\n", true);
  return {
    tokenize: (text) => model.tokenize(text, false),
    tokenizeChat,
    async labelProbabilities(messages, spellings) {
      const prompt = tokenizeChat(messages);
      const result: number[] = [];
      for (const variants of spellings) {
        const sequences = [...new Map(variants.map((v) => model.tokenize(v, false)).map((t) => [t.join(","), t])).values()];
        let sum = 0;
        for (const tokens of sequences) {
          const steps = await distributions([...prompt, ...tokens.slice(0, -1)], prompt.length - 1);
          sum += tokens.reduce((p, token, i) => p * (steps[i]!.get(token) ?? 0), 1);
        }
        result.push(sum);
      }
      return result;
    },
    async close() {
      await context.dispose();
      await model.dispose();
    },
  };
}
