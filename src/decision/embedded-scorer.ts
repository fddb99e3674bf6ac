import type { EmbeddedModel } from "../upstream/embedded-model.js";
import type { CallOptions } from "../upstream/model-call.js";
import { NoSignal, type LabelReader, type LabelScorer } from "./label-scorer.js";
import { buildMessages } from "./prompt.js";

/**
 * Labels read from the model in this process: every label's probability is
 * exact (the whole next-token distribution, continuations of multi-token
 * spellings included, through the model's label trie), so none is unseen,
 * the mass is the true one, and any number of labels fits one read.
 */
export function createEmbeddedScorer(model: EmbeddedModel): LabelScorer {
  return {
    async begin(stateBlock: string, options: CallOptions): Promise<LabelReader> {
      return {
        kind: "distribution",
        labelsPerRead: Number.POSITIVE_INFINITY,
        async read(block, labels) {
          const scored = await model.scoreLabels({ messages: buildMessages(stateBlock, block.text), spellings: labels.spellings }, options);
          const mass = scored.probabilities.reduce((a, b) => a + b, 0);
          if (!(mass > 0)) throw new NoSignal();
          return {
            distribution: { probabilities: scored.probabilities.map((p) => p / mass), mass: Math.min(mass, 1), unseen: 0, unseenMassMax: 0 },
            usage: scored.usage,
          };
        },
      };
    },
  };
}
