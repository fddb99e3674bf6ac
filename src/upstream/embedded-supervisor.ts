import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { EmbeddedModelConfig } from "../config.js";
import type { Logger } from "../logger.js";
import { loadEmbeddedModel, type EmbeddedModel } from "./embedded-model.js";
import { ensureModelFile, ModelFetchError } from "./model-fetch.js";
import { createModelPace, type ModelPace } from "./model-pace.js";

/**
 * The embedded model's life in the service: fetched and loaded in the
 * background while the service already serves (search, accounts, health),
 * with a state that health reports and that Decide turns into a 503 saying
 * what is happening, what to set, and when the next try is. A failed download
 * is tried again after a growing wait, so a machine that comes online later
 * gets decisions without a restart.
 */

export type EmbeddedModelState =
  | { state: "fetching"; percent: number }
  | { state: "loading" }
  | { state: "ready" }
  /**
   * `reason` is for the log; `summary` is what callers read (no paths, no
   * addresses); `nextTryInMs` is set while a download waits to be tried
   * again, and absent when only an operator can fix it (a file that does not load).
   */
  | { state: "failed"; reason: string; summary: string; nextTryInMs?: number };

export interface EmbeddedModelHost {
  status(): EmbeddedModelState;
  /** The loaded model, once ready. */
  model(): EmbeddedModel | undefined;
  /** Stops a download in progress (or its wait) and frees the model. */
  stop(): Promise<void>;
  /** The model's measured rate and the work queued for it, across reloads. */
  pace: ModelPace;
}

/** Time as the supervisor sees it: tests drive the waits between downloads instead of sleeping through them. */
export interface SupervisorClock {
  now(): number;
  /** Resolves after `ms`, or rejects when `signal` aborts. */
  sleep(ms: number, signal: AbortSignal): Promise<void>;
}

const realClock: SupervisorClock = {
  now: () => Date.now(),
  sleep: (ms, signal) => sleep(ms, undefined, { signal }),
};

/**
 * The waits between download tries: doubling from the first to the longest,
 * each drawn from its upper half (so replicas started together spread out),
 * and never shorter than the server asked for, nor longer than the longest.
 */
export const DOWNLOAD_RETRY = { firstMs: 10_000, longestMs: 600_000 } as const;

export function downloadRetryDelayMs(failures: number, random: number, waitHintMs?: number): number {
  const grown = Math.min(DOWNLOAD_RETRY.longestMs, DOWNLOAD_RETRY.firstMs * 2 ** Math.max(0, failures - 1));
  return Math.round(Math.min(DOWNLOAD_RETRY.longestMs, Math.max(grown / 2 + (grown / 2) * random, waitHintMs ?? 0)));
}

/** Starts fetching (unless a local file is named) and loading; returns at once. */
export function startEmbeddedModel(
  config: EmbeddedModelConfig,
  dataDir: string,
  logger: Logger,
  options: { clock?: SupervisorClock; random?: () => number; pace?: ModelPace } = {},
): EmbeddedModelHost {
  const pace = options.pace ?? createModelPace();
  const clock = options.clock ?? realClock;
  const random = options.random ?? Math.random;
  const log = logger.child({ component: "embedded-model" });
  const stopping = new AbortController();
  type Held = Exclude<EmbeddedModelState, { state: "failed" }> | { state: "failed"; reason: string; summary: string; nextTryAtMs?: number };
  let state: Held = config.modelPath ? { state: "loading" } : { state: "fetching", percent: 0 };
  let loaded: EmbeddedModel | undefined;
  const progressLogger: Logger = {
    ...log,
    info(msg, fields) {
      if (msg === "model download progress" && typeof fields?.percent === "number" && state.state === "fetching") state = { state: "fetching", percent: fields.percent };
      log.info(msg, fields);
    },
  };

  /** The verified file, downloaded again after each failure until it arrives or the service stops. */
  const fetchFile = async (): Promise<string> => {
    for (let failures = 1; ; failures++) {
      try {
        return await ensureModelFile(
          path.join(dataDir, "models", config.modelFileName),
          { url: config.modelUrl, bytes: config.modelBytes, sha256: config.modelSha256 },
          { logger: progressLogger, signal: stopping.signal },
        );
      } catch (err) {
        if (!(err instanceof ModelFetchError) || stopping.signal.aborted) throw err;
        const waitMs = downloadRetryDelayMs(failures, random(), err.waitHintMs);
        state = { state: "failed", reason: err.message, summary: summaryOf(err), nextTryAtMs: clock.now() + waitMs };
        const fields = { reason: err.message, attempt: failures, next_try_in_s: Math.ceil(waitMs / 1000), fix: "or set TYPESAFE_LLM_MODEL_PATH to a local GGUF file, or TYPESAFE_LLM_BASE_URL to an LLM server" };
        // The first failure is the one an operator must see; the tries after it are routine.
        if (failures === 1) log.error("embedded model download failed; decisions answer 503 until a later try succeeds", fields);
        else log.warn("embedded model download failed again", fields);
        await clock.sleep(waitMs, stopping.signal);
        state = { state: "fetching", percent: 0 };
      }
    }
  };

  const run = async () => {
    const file = config.modelPath ?? (await fetchFile());
    if (stopping.signal.aborted) return;
    state = { state: "loading" };
    const started = Date.now();
    const model = await loadEmbeddedModel(file, { contextTokens: config.contextTokens, sequences: config.sequences, threads: config.threads, pace }, log);
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
    const reason = `the model file could not be loaded: ${err instanceof Error ? err.message : String(err)}`;
    state = { state: "failed", reason, summary: summaryOf(err) };
    // One line says what failed and what to set; the service goes on without decisions.
    log.error("embedded model unavailable; decisions answer 503 until it is fixed", {
      reason,
      fix: "set TYPESAFE_LLM_MODEL_PATH to a local GGUF file, or TYPESAFE_LLM_BASE_URL to an LLM server, then restart",
    });
  });

  return {
    status: () => {
      if (state.state !== "failed" || state.nextTryAtMs === undefined) return state.state === "failed" ? { state: "failed", reason: state.reason, summary: state.summary } : state;
      return { state: "failed", reason: state.reason, summary: state.summary, nextTryInMs: Math.max(0, state.nextTryAtMs - clock.now()) };
    },
    model: () => loaded,
    pace,
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

/** Seconds a caller should wait before asking again; none when only an operator can help. */
export function retryAfterSeconds(state: EmbeddedModelState): number | undefined {
  switch (state.state) {
    case "fetching":
      return 30;
    case "loading":
      return 5;
    case "failed":
      return state.nextTryInMs === undefined ? undefined : Math.max(1, Math.ceil(state.nextTryInMs / 1000));
    case "ready":
      return undefined;
  }
}

/** What Decide says while the model is not ready: what is happening, and what to set. */
export function notReadyMessage(state: EmbeddedModelState): string {
  switch (state.state) {
    case "fetching":
      return `the embedded model is downloading (${state.percent}%); retry later, or set TYPESAFE_LLM_MODEL_PATH to a local GGUF file or TYPESAFE_LLM_BASE_URL to an LLM server`;
    case "loading":
      return "the embedded model is loading; retry in a few seconds";
    case "failed":
      return state.nextTryInMs === undefined
        ? `the embedded model is unavailable: ${state.summary}; set TYPESAFE_LLM_MODEL_PATH to a local GGUF file or TYPESAFE_LLM_BASE_URL to an LLM server`
        : `the embedded model is unavailable: ${state.summary}; the next try is in ${Math.max(1, Math.ceil(state.nextTryInMs / 1000))} s, or set TYPESAFE_LLM_MODEL_PATH to a local GGUF file or TYPESAFE_LLM_BASE_URL to an LLM server`;
    case "ready":
      return "the embedded model is ready";
  }
}
