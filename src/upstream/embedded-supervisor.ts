import path from "node:path";
import type { EmbeddedModelConfig } from "../config.js";
import type { Logger } from "../logger.js";
import { loadEmbeddedModel, type EmbeddedModel } from "./embedded-model.js";
import { ensureModelFile, ModelFetchError } from "./model-fetch.js";

/**
 * The embedded model's life in the service: fetched and loaded in the
 * background while the service already serves (search, accounts, health),
 * with a state that health reports and that Decide turns into a 503 saying
 * what is happening and what to set.
 */

export type EmbeddedModelState =
  | { state: "fetching"; percent: number }
  | { state: "loading" }
  | { state: "ready" }
  /** `reason` is for the log; `summary` is what callers read (no paths, no addresses). */
  | { state: "failed"; reason: string; summary: string };

export interface EmbeddedModelHost {
  status(): EmbeddedModelState;
  /** The loaded model, once ready. */
  model(): EmbeddedModel | undefined;
  /** Stops a download in progress and frees the model. */
  stop(): Promise<void>;
}

/** Starts fetching (unless a local file is named) and loading; returns at once. */
export function startEmbeddedModel(config: EmbeddedModelConfig, dataDir: string, logger: Logger): EmbeddedModelHost {
  const log = logger.child({ component: "embedded-model" });
  const stopping = new AbortController();
  let state: EmbeddedModelState = config.modelPath ? { state: "loading" } : { state: "fetching", percent: 0 };
  let loaded: EmbeddedModel | undefined;
  const progressLogger: Logger = {
    ...log,
    info(msg, fields) {
      if (msg === "model download progress" && typeof fields?.percent === "number" && state.state === "fetching") state = { state: "fetching", percent: fields.percent };
      log.info(msg, fields);
    },
  };

  const run = async () => {
    const file =
      config.modelPath ??
      (await ensureModelFile(
        path.join(dataDir, "models", config.modelFileName),
        { url: config.modelUrl, bytes: config.modelBytes, sha256: config.modelSha256 },
        { logger: progressLogger, signal: stopping.signal },
      ));
    if (stopping.signal.aborted) return;
    state = { state: "loading" };
    const started = Date.now();
    const model = await loadEmbeddedModel(file, { contextTokens: config.contextTokens, sequences: config.sequences, threads: config.threads }, log);
    if (stopping.signal.aborted) {
      await model.dispose();
      return;
    }
    loaded = model;
    state = { state: "ready" };
    log.info("embedded model ready", { file: path.basename(file), load_ms: Date.now() - started, context_tokens: config.contextTokens, sequences: config.sequences });
  };
  const done = run().catch((err: unknown) => {
    if (stopping.signal.aborted) return;
    const reason = err instanceof ModelFetchError ? err.message : `the model file could not be loaded: ${err instanceof Error ? err.message : String(err)}`;
    state = { state: "failed", reason, summary: summaryOf(err) };
    // One line says what failed and what to set; the service goes on without decisions.
    log.error("embedded model unavailable; decisions answer 503 until it is fixed", {
      reason,
      fix: "set TYPESAFE_LLM_MODEL_PATH to a local GGUF file, or TYPESAFE_LLM_BASE_URL to an LLM server, then restart",
    });
  });

  return {
    status: () => state,
    model: () => loaded,
    async stop() {
      stopping.abort();
      await done;
      await loaded?.dispose();
      loaded = undefined;
    },
  };
}

function summaryOf(err: unknown): string {
  if (!(err instanceof ModelFetchError)) return "its file could not be loaded";
  switch (err.kind) {
    case "network":
      return "it could not be downloaded (no connection to its address)";
    case "http":
    case "cut":
      return "its download failed";
    case "mismatch":
      return "its file does not match the pinned size and SHA-256";
    case "disk":
      return "its file could not be written to the data folder";
  }
}

/** Seconds a caller should wait before asking again. */
export function retryAfterSeconds(state: EmbeddedModelState): number {
  return state.state === "fetching" ? 30 : state.state === "loading" ? 5 : 300;
}

/** What Decide says while the model is not ready: what is happening, and what to set. */
export function notReadyMessage(state: EmbeddedModelState): string {
  switch (state.state) {
    case "fetching":
      return `the embedded model is downloading (${state.percent}%); retry later, or set TYPESAFE_LLM_MODEL_PATH to a local GGUF file or TYPESAFE_LLM_BASE_URL to an LLM server`;
    case "loading":
      return "the embedded model is loading; retry in a few seconds";
    case "failed":
      return `the embedded model is unavailable: ${state.summary}; set TYPESAFE_LLM_MODEL_PATH to a local GGUF file or TYPESAFE_LLM_BASE_URL to an LLM server`;
    case "ready":
      return "the embedded model is ready";
  }
}
