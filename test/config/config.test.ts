import fsSync from "node:fs";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { enabledSummary } from "../../src/app.js";
import { ConfigError } from "../../src/config-error.js";
import { parseSourceCatalog } from "../../src/search/source-config.js";
import { loadConfig } from "../../src/config.js";
import { createTestDatabase } from "../support/database.js";
import { startTestApp } from "../support/app.js";
import { runToExit } from "../support/process.js";

function problemsOf(env: Record<string, string>, cwd?: string): string[] {
  try {
    loadConfig(env, cwd);
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
      maxWaitMs: 300_000,
    });
  });

  describe("TYPESAFE_LLM_MODEL_PATH", () => {
    let dir: string;
    beforeAll(async () => {
      dir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-model-path-"));
      await fs.mkdir(path.join(dir, "models"));
      // The first bytes of a GGUF file: the magic, then version 3 (ggml's docs/gguf.md).
      await fs.writeFile(path.join(dir, "models", "m.gguf"), Buffer.from([0x47, 0x47, 0x55, 0x46, 3, 0, 0, 0]));
      await fs.writeFile(path.join(dir, "notes.txt"), "not a model\n");
    });
    afterAll(() => fs.rm(dir, { recursive: true, force: true }));

    it("is resolved against the working folder", () => {
      expect(loadConfig({ TYPESAFE_LLM_MODEL_PATH: "models/m.gguf" }, dir).llm.embedded.modelPath).toBe(path.join(dir, "models", "m.gguf"));
    });

    it.each([
      ["missing.gguf", (d: string) => `TYPESAFE_LLM_MODEL_PATH: no file at ${d}/missing.gguf, got "missing.gguf"`],
      ["models", (d: string) => `TYPESAFE_LLM_MODEL_PATH: ${d}/models is a folder, not a GGUF model file, got "models"`],
      ["notes.txt", (d: string) => `TYPESAFE_LLM_MODEL_PATH: ${d}/notes.txt is not a GGUF model file (it does not start with "GGUF"), got "notes.txt"`],
    ])("%s is a start-up error, listed with the others", (file, problem) => {
      expect(() => loadConfig({ TYPESAFE_LLM_MODEL_PATH: file, PORT: "eighty" }, dir)).toThrow(
        new ConfigError([problem(dir), 'PORT: must be an integer between 0 and 65535, got "eighty"']),
      );
    });

    it("is not checked where it is not used: an upstream URL or the embedded model off", () => {
      expect(loadConfig({ TYPESAFE_LLM_MODEL_PATH: "missing.gguf", TYPESAFE_LLM_BASE_URL: "http://llm.internal/v1" }, dir).llm.embedded.modelPath).toBe(path.join(dir, "missing.gguf"));
      expect(loadConfig({ TYPESAFE_LLM_MODEL_PATH: "missing.gguf", TYPESAFE_LLM_EMBEDDED: "off" }, dir).llm.embedded.enabled).toBe(false);
    });

    it("a file this process may not read is a start-up error", async () => {
      const locked = path.join(dir, "locked.gguf");
      await fs.writeFile(locked, "GGUF");
      await fs.chmod(locked, 0o000);
      // Root reads any file whatever its mode: there the check must pass, elsewhere it must name the refusal.
      const expected = process.getuid?.() === 0 ? [] : [`TYPESAFE_LLM_MODEL_PATH: ${locked} cannot be read by this process (EACCES), got "locked.gguf"`];
      expect(problemsOf({ TYPESAFE_LLM_MODEL_PATH: "locked.gguf" }, dir)).toEqual(expected);
    });
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
    // A malformed node list names the part at fault.
    ["postgres://u:s3cret@db1:5432,db2:99999/app", /host 2 of 2 \("db2:99999"\): the port must be a number from 1 to 65535/],
    ["postgres://u:s3cret@db1,,db3/app", /host 2 of 3 \(""\): is empty/],
    ["postgres://u:s3cret@db1,db2/app?target_session_attrs=standby", /target_session_attrs: must be read-write or any, got "standby"/],
  ])("explains a DATABASE_URL of %s without echoing it", (url, explanation) => {
    const [problem] = problemsOf({ DATABASE_URL: url });
    expect(problem).toMatch(explanation);
    expect(problem).not.toContain("s3cret");
  });

  it.each([
    "postgres://u@127.0.0.1:5432/db",
    "postgresql://u:p@db.internal/app?sslmode=require",
    "postgres://u@/db?host=/var/run/postgresql",
    "postgres://u:p@127.0.0.1:5501,127.0.0.1:5502,[::1]:5503/app?target_session_attrs=read-write&sslmode=prefer",
  ])(
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

  it("TYPESAFE_SEARCH_MIN_SAFE is off, moderate or strict; off by default; no unknown-setting warning", () => {
    expect(problemsOf({ TYPESAFE_SEARCH_MIN_SAFE: "high" })).toEqual(['TYPESAFE_SEARCH_MIN_SAFE: must be one of off, moderate, strict, got "high"']);
    expect(loadConfig({}).search.minSafe).toBe("off");
    expect(loadConfig({ TYPESAFE_SEARCH_MIN_SAFE: "strict" }).search.minSafe).toBe("strict");
    expect(parseSourceCatalog({ TYPESAFE_SEARCH_MIN_SAFE: "strict" }).warnings.filter((w) => w.includes("MIN_SAFE"))).toEqual([]);
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
  // A folder holding model.gguf, a file that passes the start-up check (the GGUF magic).
  const withModel = fsSync.mkdtempSync(path.join(os.tmpdir(), "typesafe-summary-"));
  fsSync.writeFileSync(path.join(withModel, "model.gguf"), "GGUF");
  afterAll(() => fs.rm(withModel, { recursive: true, force: true }));
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
    expect(enabledSummary(loadConfig(env, withModel))).toMatchObject(summary);
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
