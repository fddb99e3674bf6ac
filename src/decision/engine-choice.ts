import type { LlmConfig } from "../config.js";
import type { Logger } from "../logger.js";
import type { Metrics } from "../metrics.js";
import type { EmbeddedModel } from "../upstream/embedded-model.js";
import { startEmbeddedModel, type EmbeddedModelHost, type SupervisorClock } from "../upstream/embedded-supervisor.js";
import { createLlmClient } from "../upstream/llm-client.js";
import type { ModelPace } from "../upstream/model-pace.js";
import { createEmbeddedScorer } from "./embedded-scorer.js";
import { createDecisionEngine, type DecisionEngine } from "./engine.js";
import { createUpstreamScorer } from "./upstream-scorer.js";

/**
 * What decisions run on in this process, chosen once, here: the
 * OpenAI-compatible upstream when TYPESAFE_LLM_BASE_URL is set; else the
 * embedded model (fetched and loaded in the background while the service
 * already serves) unless TYPESAFE_LLM_EMBEDDED is off; else nothing, and
 * Decide answers NOT_CONFIGURED. The API's decisions and the evaluation
 * runner share it (one fair share of upstream slots).
 */
export type DecisionEngines = (
  | { kind: "upstream" }
  /** `host` tells the model's state (503 MODEL_NOT_READY until it is loaded) and its pace (the deadline of a call). */
  | { kind: "embedded"; host: EmbeddedModelHost }
  | { kind: "off" }
) & {
  /** The engine that answers now; undefined while the embedded model is not loaded, or when decisions are off. */
  current(): DecisionEngine | undefined;
  /** The upstream model's name, or "embedded": a calibration applies only to answers read by the same. */
  upstream: string;
  /** Stops the embedded model's download or frees it; nothing for the others. */
  stop(): Promise<void>;
};

export function chooseDecisionEngines(deps: {
  llm: LlmConfig;
  /** Where the embedded model's file is downloaded to (the data folder). */
  dataDir: string;
  logger: Logger;
  metrics?: Pick<Metrics, "recordLlmCall">;
  /** Tests' clock of the embedded model's waits between download tries, and its pace. */
  embedded?: { clock?: SupervisorClock; pace?: ModelPace };
}): DecisionEngines {
  const { llm, logger } = deps;
  if (llm.baseUrl !== undefined) {
    const engine = createDecisionEngine({ scorer: createUpstreamScorer(createLlmClient({ config: llm, logger, metrics: deps.metrics })), logger });
    return { kind: "upstream", upstream: llm.model, current: () => engine, stop: async () => {} };
  }
  if (!llm.embedded.enabled) return { kind: "off", upstream: "embedded", current: () => undefined, stop: async () => {} };
  const host = startEmbeddedModel(llm.embedded, deps.dataDir, logger, deps.embedded);
  // One engine per loaded model: a model loaded again (after a failed download) gets its own.
  let built: { model: EmbeddedModel; engine: DecisionEngine } | undefined;
  return {
    kind: "embedded",
    host,
    upstream: "embedded",
    current() {
      const model = host.model();
      if (!model) return undefined;
      if (built?.model !== model) built = { model, engine: createDecisionEngine({ scorer: createEmbeddedScorer(model), logger }) };
      return built.engine;
    },
    stop: () => host.stop(),
  };
}
