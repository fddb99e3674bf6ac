import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fromJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { afterAll, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config.js";
import { chooseDecisionEngines } from "../../src/decision/engine-choice.js";
import { renderState } from "../../src/decision/prompt.js";
import { createLogger } from "../../src/logger.js";
import { writeTinyGguf } from "../support/tiny-gguf.js";
import { waitFor } from "../support/wait.js";

const logger = createLogger("silent");
const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-engine-choice-"));
afterAll(() => fs.rmSync(dataDir, { recursive: true, force: true }));
const llmConfig = (env: Record<string, string>) => loadConfig({ TYPESAFE_DATA_DIR: dataDir, ...env }, dataDir).llm;

describe("where decisions run is chosen once", () => {
  it("an upstream URL wins over the embedded model, which is then never started", async () => {
    const engines = chooseDecisionEngines({ llm: llmConfig({ TYPESAFE_LLM_BASE_URL: "http://127.0.0.1:9/v1", TYPESAFE_LLM_MODEL: "m-1" }), dataDir, logger });
    expect(engines.kind).toBe("upstream");
    expect(engines.upstream).toBe("m-1");
    expect(engines.current()).toBeDefined();
    expect(engines.current()).toBe(engines.current());
    await engines.stop();
    // Nothing was fetched: the embedded model would have made its folder in the data folder.
    expect(fs.existsSync(path.join(dataDir, "models"))).toBe(false);
  });

  it("with the embedded model off and no upstream there is no engine", async () => {
    const engines = chooseDecisionEngines({ llm: llmConfig({ TYPESAFE_LLM_EMBEDDED: "off" }), dataDir, logger });
    expect(engines.kind).toBe("off");
    expect(engines.current()).toBeUndefined();
    await engines.stop();
    expect(fs.existsSync(path.join(dataDir, "models"))).toBe(false);
  });

  it("without an upstream the embedded model answers once it is loaded, one engine per loaded model", async () => {
    const file = writeTinyGguf(path.join(dataDir, "tiny.gguf"));
    const engines = chooseDecisionEngines({
      llm: llmConfig({ TYPESAFE_LLM_MODEL_PATH: file, TYPESAFE_LLM_CONTEXT_TOKENS: "2048", TYPESAFE_LLM_THREADS: "1" }),
      dataDir,
      logger,
    });
    if (engines.kind !== "embedded") throw new Error(`chose ${engines.kind}`);
    expect(engines.upstream).toBe("embedded");
    expect(engines.current()).toBeUndefined();
    await waitFor(() => engines.host.status().state === "ready", "the tiny model to load", 60_000);
    const engine = engines.current()!;
    expect(engines.current()).toBe(engine);
    const outcome = await engine.decide(
      { stateBlock: renderState(fromJson(ValueSchema, "a state")), questions: [{ key: "q", type: "noul", instructions: "Is it so?" }] },
      { signal: new AbortController().signal, deadlineMs: Date.now() + 20_000 },
    );
    // Read from the whole vocabulary: no label is ever unseen, as it can be in an upstream's window.
    expect(outcome.answers[0]![1]).toMatchObject({ type: "noul", xMethod: "logprobs" });
    expect(outcome.answers[0]![1]).not.toHaveProperty("xUnseen");
    await engines.stop();
    expect(engines.current()).toBeUndefined();
  }, 120_000);
});
