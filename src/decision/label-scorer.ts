import type { CallOptions, ChatUsage } from "../upstream/model-call.js";
import type { LabelDistribution } from "./answer-math.js";
import type { LabelSet } from "./labels.js";
import type { QuestionBlock } from "./prompt.js";

/**
 * How the decision engine reads an answer: the labels a question lists, as a
 * probability distribution. Two implementations: upstream-scorer.ts reads an
 * OpenAI-compatible server (a top-k logprob window, or a stated distribution
 * when the server offers no logprobs); embedded-scorer.ts reads the model in
 * this process (the whole vocabulary, exactly). Which one answers is chosen
 * once per process in engine-choice.ts. The engine owns what is the same for
 * both: the prompt of each question, the two stages of a long choice, the
 * answer built from the distribution, and the failure of one question.
 */
export interface LabelScorer {
  /**
   * A reader for the questions of one request over one state, reading with
   * the request's signal, deadline and fair-share party. The upstream learns
   * here how its server can be read (its capability probe, cached); a failure
   * fails every question of the request.
   */
  begin(stateBlock: string, options: CallOptions): Promise<LabelReader>;
}

export type LabelReader = DistributionReader | VerbalizedReader;

/** Reads the model's next-token distribution over the labels. */
export interface DistributionReader {
  kind: "distribution";
  /** Labels one read can tell apart (a server's logprob cap); a choice over more is asked in two stages. */
  labelsPerRead: number;
  /** One question block, read over `labels`; throws NoSignal when none of them could be read. */
  read(block: QuestionBlock, labels: LabelSet): Promise<Readout>;
}

/**
 * The model states the distribution as JSON (a server without usable
 * logprobs): the engine asks it over several orders of the labels and averages.
 */
export interface VerbalizedReader {
  kind: "verbalized";
  /** The probabilities the reply states for `symbols`, in their order; throws NoSignal when it never states them. */
  state(block: QuestionBlock, symbols: readonly string[]): Promise<{ probabilities: number[]; usage: ChatUsage }>;
}

export interface Readout {
  distribution: LabelDistribution;
  usage: ChatUsage;
}

/** No label could be read (retryable). */
export class NoSignal extends Error {
  constructor() {
    super("no label in the window");
    this.name = "NoSignal";
  }
}

/** The model refused to answer. */
export class Refused extends Error {
  constructor() {
    super("the model refused");
    this.name = "Refused";
  }
}
