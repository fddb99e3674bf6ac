/**
 * What an upstream call costs the service's own process: client CPU per POST
 * through src/upstream/http.ts (postWithRetry, as every LLM call goes),
 * against a bare `node:http` keep-alive client sending the same request in the
 * same run (the baseline). 40 calls at a time, as a 40-question decision
 * sends them, to the fake OpenAI-compatible upstream in its own process;
 * alternated in batches so the machine's drift falls on both.
 *
 *   npm run bench:upstream-client
 */
import { setMaxListeners } from "node:events";
import http from "node:http";
import os from "node:os";
import { postWithRetry } from "../src/upstream/http.js";
import { startFakeUpstream } from "./processes.js";
import { alternatedCpuMicros } from "./support.js";

const IN_FLIGHT = 40;
const BATCHES = 10;
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 20);

const body = JSON.stringify({
  model: "bench-model",
  messages: [
    { role: "system", content: "Answer the question about the state with one of the allowed tokens.".repeat(8) },
    { role: "user", content: "<state>\nI was charged twice for my pro plan this month\n</state>\n\nIs this a billing issue? yes or no".repeat(4) },
  ],
  max_tokens: 1,
  logprobs: true,
  top_logprobs: 20,
});

const bareAgent = new http.Agent({ keepAlive: true, maxFreeSockets: 256 });

/** The baseline: node:http with a keep-alive agent, no timeout, retry or cancellation. */
function barePost(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      url,
      { method: "POST", agent: bareAgent, headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) } },
      (res) => {
        res.setEncoding("utf8");
        let text = "";
        res.on("data", (chunk: string) => (text += chunk));
        res.on("end", () => resolve(text));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

async function main() {
  const fake = await startFakeUpstream();
  const url = `${fake.url}/v1/chat/completions`;
  const signal = new AbortController().signal;
  setMaxListeners(0, signal); // 40 calls of one decision share its signal, as src/decision/engine.ts allows
  const ours = async () => {
    const response = await postWithRetry(
      { url, headers: { authorization: "Bearer bench" }, body },
      { signal, deadlineMs: Date.now() + 30_000, attemptTimeoutMs: 30_000, maxRetries: 0 },
    );
    if (response.status !== 200) throw new Error(`the fake answered ${response.status}`);
  };
  /** BATCHES bursts of IN_FLIGHT calls at a time. */
  const bursts = (call: () => Promise<unknown>) => async () => {
    for (let i = 0; i < BATCHES; i++) await Promise.all(Array.from({ length: IN_FLIGHT }, call));
  };
  const paths = { "bare node:http (baseline)": bursts(() => barePost(url)), "postWithRetry (the service)": bursts(ours) };
  try {
    const cpuMicros = await alternatedCpuMicros(paths, ROUNDS);
    const perCall = (name: string) => cpuMicros.get(name)! / (ROUNDS * BATCHES * IN_FLIGHT);
    const baseline = perCall("bare node:http (baseline)");
    console.log(`upstream client bench: ${os.cpus().length} cores, Node ${process.version}, ${IN_FLIGHT} calls in flight, ${ROUNDS} alternated rounds`);
    for (const name of Object.keys(paths)) {
      console.log(`${name.padEnd(28)} ${perCall(name).toFixed(0).padStart(5)} µs client CPU per call  ${(perCall(name) / baseline).toFixed(2)}×`);
    }
  } finally {
    bareAgent.destroy();
    await fake.close();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
