/**
 * The embedded model at its real size: a stand-in of the pinned file
 * (stand-in-model.ts: its exact shape and tensor types, the real Qwen2
 * tokenizer, random weights) measured first through node-llama-cpp alone, the
 * engine's own rate (the floor), then through the service as users run it
 * (`node dist/bundle/main.mjs` in its own process, a scratch PostgreSQL
 * database, no upstream), in one run.
 *
 *   npm run bench:embedded
 *   BENCH_THREADS=1 BENCH_ONE_ROUNDS=3 BENCH_FORTY_ROUNDS=1 npm run bench:embedded
 *   BENCH_ONLY=engine BENCH_THREADS=2 npm run bench:embedded   # llama.cpp's rates alone, at a thread count
 *
 * Efficiency is (the fewest tokens the questions need ÷ the engine's prompt
 * rate) ÷ the service's latency: 1.0 means the service costs exactly what
 * llama.cpp needs for those tokens. The fewest tokens are the prompts'
 * distinct prefixes (the shared prefix once, each question's own tokens
 * once), counted with the service's own tokenizer path; the tokens the
 * service evaluated come from its `typesafe_embedded_model_tokens_evaluated_total`.
 * Every measure uses a new state, so nothing is cached from an earlier one.
 */
import crypto from "node:crypto";
import fs from "node:fs/promises";
import os from "node:os";
import { create } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import type { Token } from "node-llama-cpp";
import { createKnex } from "../src/db/database.js";
import { firstCallMessages, type QuestionSpec } from "../src/decision/engine.js";
import { optionOrder } from "../src/decision/labels.js";
import { renderState } from "../src/decision/prompt.js";
import { createLogger } from "../src/logger.js";
import { loadEmbeddedModel } from "../src/upstream/embedded-model.js";
import { buildService, startService, type ServiceProcess } from "./processes.js";
import { standInModelFile, standInTypes } from "./stand-in-model.js";
import { createBenchAccounts, createScratchDatabase, median, promSample } from "./support.js";

const SERVER_URL = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
const THREADS = Number(process.env.BENCH_THREADS ?? 0);
const ONE_ROUNDS = Number(process.env.BENCH_ONE_ROUNDS ?? 3);
const FORTY_ROUNDS = Number(process.env.BENCH_FORTY_ROUNDS ?? 1);
const CALLERS = Number(process.env.BENCH_CALLERS ?? 4);
const BATCH_TOKENS = 512;
const DECODE_STEPS = 8;
/** About one question's own tokens. */
const QUESTION_TOKENS = 40;

/** About 600 tokens of support-ticket prose; `nonce` makes each state new from its first token. */
function stateText(nonce: string): string {
  const sentences = [
    "The customer writes that the invoice for the pro plan arrived twice this month, once on the first and once on the third.",
    "They attached both receipts and say the card statement shows two charges of the same amount a day apart.",
    "Earlier tickets from this account were about a failed export and a password reset, both closed within a day.",
    "The account has twelve seats, uses single sign-on, and renewed its yearly contract in the spring.",
    "Support already confirmed that the second charge was not refunded automatically by the payment provider.",
    "The customer asks for the duplicate charge to be reversed and wants to know whether it will happen again.",
  ];
  const lines = [`Ticket ${nonce}.`];
  for (let i = 0; lines.join(" ").length < 2_750; i++) lines.push(sentences[i % sentences.length]!);
  return lines.join(" ");
}

/** Questions of the three types in turn, as decideBody does: noul, choice (letters), score (digits). */
function questions(count: number): QuestionSpec[] {
  return Array.from({ length: count }, (_, i): QuestionSpec => {
    if (i % 3 === 0) return { key: `q${i}`, type: "noul", instructions: `Is aspect ${i} of this ticket urgent?` };
    if (i % 3 === 1) return { key: `q${i}`, type: "choice", instructions: `Which team handles aspect ${i}?`, options: optionOrder(["billing", "technical", "sales"]) };
    return { key: `q${i}`, type: "score", instructions: `How big is impact ${i}?`, labels: ["none", "low", "medium", "high"] };
  });
}

function requestBody(state: string, specs: QuestionSpec[]): string {
  return JSON.stringify({
    model: "typesafe/service-1.13",
    state,
    questions: Object.fromEntries(
      specs.map((q) => [
        q.key,
        q.type === "noul"
          ? { type: "noul", instructions: q.instructions }
          : q.type === "choice"
            ? { type: "choice", instructions: q.instructions, criteria: Object.fromEntries(q.options.map((o) => [o, null])) }
            : { type: "score", instructions: q.instructions, criteria: q.labels },
      ]),
    ),
  });
}

/** Distinct prefixes of the prompts: what evaluating them costs with nothing evaluated twice. */
function fewestTokens(prompts: readonly Token[][]): number {
  const seen = new Set<string>();
  for (const prompt of prompts) {
    let key = "";
    for (const token of prompt) {
      key += `${token},`;
      seen.add(key);
    }
  }
  return seen.size;
}

interface EngineRate {
  promptTokensPerS: number;
  /** CPU time per prompt token (all threads): the floor that a busy machine's wall time hides. */
  promptCpuMsPerToken: number;
  /** The same for a question-sized batch after a held 512-token prefix. */
  questionCpuMsPerToken: number;
  decodeStepMs: number;
}

/** llama.cpp through node-llama-cpp, nothing of the service: a 512-token batch and one-token steps, each read as the service reads. */
async function engineRate(file: string, threads: number): Promise<EngineRate & { threadsUsed: number }> {
  const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
  const llama = await getLlama({ gpu: false, build: "never", progressLogs: false, logLevel: LlamaLogLevel.error });
  const model = await llama.loadModel({ modelPath: file });
  const context = await model.createContext({ contextSize: 2 * BATCH_TOKENS, sequences: 1, ...(threads > 0 ? { threads } : {}) });
  try {
    const sequence = context.getSequence();
    const text = stateText("engine").repeat(2);
    const tokens = model.tokenize(text).slice(0, BATCH_TOKENS);
    const read = { generateNext: { logits: { filter: { tokens: [tokens[0]!], includeTop: 1 } }, totalLogitWeight: true } } as const;
    const batch = () => sequence.controlledEvaluate(tokens.map((t, i) => (i === tokens.length - 1 ? [t, read] : t)));
    await batch(); // warm-up: page the weights in
    const batchMs: number[] = [];
    const batchCpuMs: number[] = [];
    for (let round = 0; round < 3; round++) {
      await sequence.clearHistory();
      const started = performance.now();
      const cpu = process.cpuUsage();
      await batch();
      batchMs.push(performance.now() - started);
      const used = process.cpuUsage(cpu);
      batchCpuMs.push((used.user + used.system) / 1000);
    }
    // A question's own tokens after a held prefix: the batches a decision sends once its state is evaluated.
    const questionCpuMs: number[] = [];
    const question = tokens.slice(0, QUESTION_TOKENS);
    for (let round = 0; round < 3; round++) {
      await sequence.eraseContextTokenRanges([{ start: BATCH_TOKENS, end: sequence.nextTokenIndex }]);
      const cpu = process.cpuUsage();
      await sequence.controlledEvaluate(question.map((t, i) => (i === question.length - 1 ? [t, read] : t)));
      const used = process.cpuUsage(cpu);
      questionCpuMs.push((used.user + used.system) / 1000);
    }
    const stepMs: number[] = [];
    for (let i = 0; i < DECODE_STEPS; i++) {
      const started = performance.now();
      await sequence.controlledEvaluate([[tokens[i]!, read]]);
      stepMs.push(performance.now() - started);
    }
    return { promptTokensPerS: BATCH_TOKENS / (median(batchMs) / 1000), promptCpuMsPerToken: median(batchCpuMs) / BATCH_TOKENS, questionCpuMsPerToken: median(questionCpuMs) / QUESTION_TOKENS, decodeStepMs: median(stepMs), threadsUsed: context.currentThreads };
  } finally {
    await context.dispose();
    await model.dispose();
  }
}

/** The prompts the service builds for `specs` on `state`, tokenized by the service's own embedded-model code. */
async function promptCounter(file: string): Promise<{ fewest(state: string, specs: QuestionSpec[]): number; dispose(): Promise<void> }> {
  const logger = createLogger("silent");
  const model = await loadEmbeddedModel(file, { contextTokens: 1024, sequences: 1, threads: 1 }, logger);
  return {
    fewest(state, specs) {
      const stateBlock = renderState(create(ValueSchema, { kind: { case: "stringValue", value: state } }));
      return fewestTokens(specs.map((q) => model.promptTokens(firstCallMessages(stateBlock, q))));
    },
    dispose: () => model.dispose(),
  };
}

/** From /proc/<pid>/status: resident memory (VmRSS = RssAnon + RssFile + RssShmem), its peak, and its anonymous and file-backed parts. */
async function rssMb(pid: number, field: "VmRSS" | "VmHWM" | "RssAnon" | "RssFile"): Promise<number> {
  const status = await fs.readFile(`/proc/${pid}/status`, "utf8");
  return Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(status)![1]) / 1024;
}

async function main() {
  const file = await standInModelFile();
  const threads = THREADS > 0 ? THREADS : os.availableParallelism();
  console.log(`embedded model bench: ${os.cpus()[0]?.model ?? "cpu"}, ${os.availableParallelism()} CPUs, Node ${process.version}, ${new Date().toISOString()}`);
  console.log(`stand-in: ${file} (${((await fs.stat(file)).size / 1e6).toFixed(1)} MB; tensors ${standInTypes()}; random weights), ${threads} threads`);

  const engine = await engineRate(file, threads);
  console.log(
    `engine (node-llama-cpp alone, ${engine.threadsUsed} threads): ${engine.promptTokensPerS.toFixed(1)} prompt tokens/s on a ${BATCH_TOKENS}-token batch (${engine.promptCpuMsPerToken.toFixed(2)} ms CPU per token; ${engine.questionCpuMsPerToken.toFixed(2)} ms in a ${QUESTION_TOKENS}-token batch after it); one-token step ${engine.decodeStepMs.toFixed(1)} ms`,
  );
  // `BENCH_ONLY=engine`: the engine's rates alone, e.g. to compare thread counts.
  if (process.env.BENCH_ONLY === "engine") return;
  const counter = await promptCounter(file);

  await buildService();
  const scratch = await createScratchDatabase(SERVER_URL);
  let service: ServiceProcess | undefined;
  try {
    const spawned = performance.now();
    service = await startService({ DATABASE_URL: scratch.url, TYPESAFE_LLM_MODEL_PATH: file, TYPESAFE_LLM_THREADS: String(threads),
      // The bench measures how long the work takes, not whether it fits the product's deadline.
      TYPESAFE_LLM_REQUEST_TIMEOUT_MS: "1800000",
      TYPESAFE_LOG_LEVEL: "warn",
    });
    const { url, pid } = service;
    const health = async () => JSON.stringify(await (await fetch(`${url}/healthz`)).json());
    while (!(await health()).includes('"model_state":"ready"')) {
      if (performance.now() - spawned > 180_000) throw new Error("the model did not load within 180 s");
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const readyMs = performance.now() - spawned;
    const readyRss = await rssMb(pid, "VmRSS");
    // Anonymous memory is what the process allocated (weights read into memory, caches, buffers); file-backed pages are mapped files the kernel can drop.
    const readyAnon = await rssMb(pid, "RssAnon");
    const readyFile = await rssMb(pid, "RssFile");
    const db = createKnex(scratch.url, 2);
    const keys = (await createBenchAccounts(db, CALLERS, 100)).map((a) => a.apiKey);
    await db.destroy();
    const evaluated = async () => promSample(await (await fetch(`${url}/metrics`)).text(), "typesafe_embedded_model_tokens_evaluated_total");

    const decide = async (specs: QuestionSpec[], key: string) => {
      const state = stateText(crypto.randomBytes(6).toString("hex"));
      const started = performance.now();
      const cpuBefore = await service!.cpuSeconds();
      const response = await fetch(`${url}/api/v1/decisions`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
        body: requestBody(state, specs),
      });
      const body = await response.text();
      const ms = performance.now() - started;
      const cpuMs = ((await service!.cpuSeconds()) - cpuBefore) * 1000;
      if (response.status !== 200 || body.includes('"error"')) throw new Error(`decision failed: ${response.status} ${body.slice(0, 300)}`);
      return { ms, cpuMs, fewest: counter.fewest(state, specs) };
    };
    /** One request at a time on a new state: latency, tokens evaluated and the fewest. */
    const alone = async (count: number, rounds: number) => {
      const runs = [];
      for (let r = 0; r < rounds; r++) {
        const before = await evaluated();
        const { ms, cpuMs, fewest } = await decide(questions(count), keys[0]!);
        runs.push({ ms, cpuMs, fewest, evaluated: (await evaluated()) - before });
      }
      const ms = median(runs.map((r) => r.ms));
      const fewest = median(runs.map((r) => r.fewest));
      const tokens = median(runs.map((r) => r.evaluated));
      const floorMs = (fewest / engine.promptTokensPerS) * 1000;
      const cpuMs = median(runs.map((r) => r.cpuMs));
      const cpuEfficiency = (fewest * engine.promptCpuMsPerToken) / cpuMs;
      return { count, rounds, ms, maxMs: Math.max(...runs.map((r) => r.ms)), fewest, tokens, floorMs, efficiency: floorMs / ms, cpuMs, cpuEfficiency };
    };
    await decide(questions(1), keys[0]!); // warm-up of the service's own path
    const rows = [await alone(1, ONE_ROUNDS), await alone(40, FORTY_ROUNDS)];
    console.log("| measure | p50 latency | floor (fewest ÷ engine rate) | efficiency | service CPU (efficiency by CPU) | tokens evaluated | fewest | evaluated ÷ fewest |");
    console.log("|---|---|---|---|---|---|---|---|");
    for (const r of rows) {
      console.log(
        `| ${r.count} question${r.count > 1 ? "s" : ""}, new state (${r.rounds} run${r.rounds > 1 ? "s" : ""}, max ${(r.maxMs / 1000).toFixed(2)} s) | ${(r.ms / 1000).toFixed(2)} s | ${(r.floorMs / 1000).toFixed(2)} s | ${r.efficiency.toFixed(2)} | ${(r.cpuMs / 1000).toFixed(2)} s (${r.cpuEfficiency.toFixed(2)}) | ${r.tokens} | ${r.fewest} | ${(r.tokens / r.fewest).toFixed(2)}× |`,
      );
    }

    // Several callers at once, each one question on a new state of its own.
    const started = performance.now();
    const before = await evaluated();
    const calls = await Promise.all(keys.map((key) => decide(questions(1), key)));
    const wallMs = performance.now() - started;
    const callersEvaluated = (await evaluated()) - before;
    const fewest = calls.reduce((sum, c) => sum + c.fewest, 0);
    const floorMs = (fewest / engine.promptTokensPerS) * 1000;
    console.log(
      `| ${CALLERS} callers at once, 1 question each, new states | p50 ${(median(calls.map((c) => c.ms)) / 1000).toFixed(2)} s, all done in ${(wallMs / 1000).toFixed(2)} s | ${(floorMs / 1000).toFixed(2)} s | ${(floorMs / wallMs).toFixed(2)} | — | ${callersEvaluated} | ${fewest} | ${(callersEvaluated / fewest).toFixed(2)}× |`,
    );
    console.log(`time to ready (spawn to model ready): ${(readyMs / 1000).toFixed(2)} s; RSS when ready ${readyRss.toFixed(0)} MB (anonymous ${readyAnon.toFixed(0)}, file ${readyFile.toFixed(0)}), peak ${(await rssMb(pid, "VmHWM")).toFixed(0)} MB, at the end ${(await rssMb(pid, "VmRSS")).toFixed(0)} MB (anonymous ${(await rssMb(pid, "RssAnon")).toFixed(0)}, file ${(await rssMb(pid, "RssFile")).toFixed(0)})`);
  } finally {
    await service?.stop();
    await counter.dispose();
    await scratch.drop();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
