import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { enabledSummary } from "../../src/app.js";
import { ConfigError } from "../../src/config-error.js";
import { loadConfig } from "../../src/config.js";
import { createTestDatabase } from "../support/database.js";
import { startTestApp } from "../support/app.js";
import { runToExit } from "../support/process.js";

function problemsOf(env: Record<string, string>): string[] {
  try {
    loadConfig(env);
  } catch (err) {
    if (err instanceof ConfigError) return err.problems;
    throw err;
  }
  return [];
}

const SIX_BAD = {
  PORT: "eighty",
  TYPESAFE_LOG_LEVEL: "loud",
  DATABASE_URL: "nonsense",
  TYPESAFE_LLM_BASE_URL: "ftp://llm.internal",
  TYPESAFE_SEARCH_SOURCES: "google",
  TYPESAFE_SEARCH_BRAVE_RATE: "fast",
};

describe("the embedded model's settings", () => {
  it("refuses what it cannot use, each naming the variable and the rule", () => {
    expect(
      problemsOf({ TYPESAFE_LLM_EMBEDDED: "maybe", TYPESAFE_LLM_MODEL_URL: "ftp://mirror", TYPESAFE_LLM_CONTEXT_TOKENS: "100", TYPESAFE_LLM_SEQUENCES: "0", TYPESAFE_LLM_THREADS: "-1" }),
    ).toEqual([
      'TYPESAFE_LLM_EMBEDDED: must be on or off, got "maybe"',
      'TYPESAFE_LLM_MODEL_URL: must be an http(s) URL, got "ftp://mirror"',
      'TYPESAFE_LLM_CONTEXT_TOKENS: must be an integer between 512 and 131072, got "100"',
      'TYPESAFE_LLM_SEQUENCES: must be an integer between 1 and 64, got "0"',
      'TYPESAFE_LLM_THREADS: must be an integer between 0 and 256, got "-1"',
    ]);
  });

  it("defaults to the pinned model with bounded memory", () => {
    expect(loadConfig({}, "/srv").llm.embedded).toEqual({
      enabled: true,
      modelPath: undefined,
      modelUrl: "https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF/resolve/9217f5db79a29953eb74d5343926648285ec7e67/qwen2.5-0.5b-instruct-q4_k_m.gguf",
      modelBytes: 491_400_032,
      modelSha256: "74a4da8c9fdbcd15bd1f6d01d621410d31c6fc00986f5eb687824e7b93d7a9db",
      modelFileName: "qwen2.5-0.5b-instruct-q4_k_m.gguf",
      contextTokens: 8192,
      sequences: 2,
      threads: 0,
    });
    expect(loadConfig({ TYPESAFE_LLM_MODEL_PATH: "models/m.gguf" }, "/srv").llm.embedded.modelPath).toBe("/srv/models/m.gguf");
  });
});

describe("configuration is checked in one pass", () => {
  it("lists every problem of the core, LLM and search variables together", () => {
    const problems = problemsOf(SIX_BAD);
    expect(problems).toHaveLength(6);
    for (const name of Object.keys(SIX_BAD)) expect(problems.some((p) => p.startsWith(`${name}:`)), name).toBe(true);
    expect(problems.find((p) => p.startsWith("DATABASE_URL"))).toContain("not a postgres:// URL");
  });

  it.each([
    ["mysql://root:s3cret@db:3306/app", /scheme is "mysql"/],
    ["postgres://user:s3cret@/app", /names no host/],
    // A socket address with no host, as libpq takes it: refused with the form the pg driver reads.
    ["postgres:///app", /names no host.*postgres:\/\/user@\/database\?host=\/var\/run\/postgresql/],
  ])("explains a DATABASE_URL of %s without echoing it", (url, explanation) => {
    const [problem] = problemsOf({ DATABASE_URL: url });
    expect(problem).toMatch(explanation);
    expect(problem).not.toContain("s3cret");
  });

  it.each(["postgres://u@127.0.0.1:5432/db", "postgresql://u:p@db.internal/app?sslmode=require", "postgres://u@/db?host=/var/run/postgresql"])(
    "accepts %s",
    (url) => {
      expect(problemsOf({ DATABASE_URL: url })).toEqual([]);
    },
  );

  it("TYPESAFE_METRICS is on or off", () => {
    expect(problemsOf({ TYPESAFE_METRICS: "maybe" })).toEqual(['TYPESAFE_METRICS: must be on or off, got "maybe"']);
    expect(loadConfig({}).metrics).toBe(true);
    expect(loadConfig({ TYPESAFE_METRICS: "off" }).metrics).toBe(false);
  });

  it("the service exits with code 2 and every problem before it opens anything", async () => {
    const dataDir = path.join(await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-config-")), "store");
    const result = await runToExit("src/main.ts", [], { ...SIX_BAD, DATABASE_URL: "", TYPESAFE_DATA_DIR: dataDir });
    expect(result.code).toBe(2);
    for (const name of ["PORT", "TYPESAFE_LOG_LEVEL", "TYPESAFE_LLM_BASE_URL", "TYPESAFE_SEARCH_SOURCES", "TYPESAFE_SEARCH_BRAVE_RATE"]) {
      expect(result.stderr).toContain(`${name}:`);
    }
    await expect(fs.access(dataDir)).rejects.toThrow();
    await fs.rm(path.dirname(dataDir), { recursive: true, force: true });
  }, 30_000);
});

describe("the start-up summary", () => {
  it.each([
    [{}, { decisions: "embedded: qwen2.5-0.5b-instruct-q4_k_m.gguf, fetched into the data folder on first start", search: expect.stringMatching(/^on: brave.*|^on: wikipedia/) }],
    [{ TYPESAFE_LLM_MODEL_PATH: "model.gguf" }, { decisions: "embedded: a local model file (TYPESAFE_LLM_MODEL_PATH)" }],
    [{ TYPESAFE_LLM_EMBEDDED: "off" }, { decisions: "off: set TYPESAFE_LLM_BASE_URL (the embedded model is off)" }],
    [{ TYPESAFE_LLM_EMBEDDED: "off", TYPESAFE_LLM_BASE_URL: "http://llm.internal:8000/v1" }, { decisions: "on: llm.internal:8000, model default" }],
    [
      { TYPESAFE_LLM_BASE_URL: "http://llm.internal:8000/v1", TYPESAFE_LLM_MODEL: "qwen3", TYPESAFE_SEARCH_SOURCES: "none" },
      { decisions: "on: llm.internal:8000, model qwen3", search: "off: no source configured (TYPESAFE_SEARCH_SOURCES)" },
    ],
    [{ TYPESAFE_SEARCH_SOURCES: "brave,wikipedia" }, { search: "on: wikipedia" }],
  ])("%j → %j", (env, summary) => {
    expect(enabledSummary(loadConfig(env))).toMatchObject(summary);
  });

  it("is logged at start, with no contact warning when no source that needs one is enabled", async () => {
    const database = await createTestDatabase(2);
    const lines: string[] = [];
    const app = await startTestApp(database, { TYPESAFE_LOG_LEVEL: "info", TYPESAFE_SEARCH_SOURCES: "none" }, { onLogLine: (l) => lines.push(l) });
    await app.stop();
    await database.close();
    const entries = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(entries.find((e) => e["msg"] === "enabled")).toMatchObject({ decisions: "off: set TYPESAFE_LLM_BASE_URL (the embedded model is off)" });
    expect(lines.join("\n")).not.toContain("TYPESAFE_SEARCH_CONTACT");
  });
});
