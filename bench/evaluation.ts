/**
 * Evaluation examples a second against metered decisions a second, in the
 * same run, on the same service, against the same fake upstream (its own
 * process, answering at once): both ask one noul question of the same state.
 *
 *   npm run bench:evaluation                          # embedded store in a temp folder
 *   DATABASE_URL=postgres://… npm run bench:evaluation  # a scratch database on that server
 *   BENCH_DURATION_S=5 BENCH_IN_FLIGHT=8 BENCH_EXAMPLES=2000 npm run bench:evaluation
 *
 * The decisions run with BENCH_IN_FLIGHT connections (one account each, limits
 * far above the product's); the evaluation with as many examples in flight on
 * this replica. An evaluation example costs what a call costs (hold, decision,
 * settle) plus its claim and its outcome row, so the ratio says what the
 * runner adds; it is not a target to beat.
 */
import { fromJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { startApp } from "../src/app.js";
import { loadConfig } from "../src/config.js";
import { createEvaluation } from "../src/evaluation/evaluations.js";
import { QuestionSchema } from "../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { createLogger } from "../src/logger.js";
import { startFakeUpstream } from "./processes.js";
import { createBenchAccounts, openBenchStore, runAutocannon } from "./support.js";

const DURATION_S = Number(process.env.BENCH_DURATION_S ?? 5);
const IN_FLIGHT = Number(process.env.BENCH_IN_FLIGHT ?? 8);
const EXAMPLES = Number(process.env.BENCH_EXAMPLES ?? 2000);
const STATE = { ticket: "I was charged twice for my pro plan this month", customer: { id: "c-42", plan: "pro" } };
const QUESTION = { type: "noul", instructions: "Is it urgent?" };

async function main() {
  const fake = await startFakeUpstream();
  await fake.setDelay(0);
  const store = await openBenchStore(process.env.DATABASE_URL);
  const config = loadConfig({
    PORT: "0",
    TYPESAFE_LOG_LEVEL: "silent",
    TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
    TYPESAFE_LLM_MAX_CONCURRENT_CALLS: "512",
    TYPESAFE_EVALUATION_EXAMPLES_IN_FLIGHT: String(IN_FLIGHT),
    TYPESAFE_EVALUATION_POLL_MS: "20",
    ...store.env,
  });
  const app = await startApp(config, createLogger("silent"));
  const { db } = app.database;
  try {
    const accounts = await createBenchAccounts(db, IN_FLIGHT, 1_000);
    const url = `${app.server.url}/api/v1/decisions`;
    const body = JSON.stringify({ model: "typesafe/service-1.13", state: STATE, questions: { urgent: QUESTION } });
    const warm = await fetch(url, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${accounts[0]!.apiKey}` }, body });
    if (warm.status !== 200) throw new Error(`warm-up decide answered ${warm.status}: ${await warm.text()}`);
    let next = 0;
    const decisions = await runAutocannon({
      url,
      method: "POST",
      headers: { "content-type": "application/json" },
      body,
      connections: IN_FLIGHT,
      duration: DURATION_S,
      setupClient: (client) => client.setHeaders({ "content-type": "application/json", authorization: `Bearer ${accounts[next++ % accounts.length]!.apiKey}` }),
    });

    const started = performance.now();
    const evaluation = await createEvaluation(db, {
      accountId: accounts[0]!.id,
      createdBy: "operator",
      name: "bench",
      questions: { urgent: fromJson(QuestionSchema, QUESTION) },
      examples: Array.from({ length: EXAMPLES }, (_, i) => ({ line: i + 1, state: JSON.stringify({ ...STATE, n: i }), labels: { urgent: fromJson(ValueSchema, i % 2 === 0) } })),
      capUnits: 1e14,
      examplesInFlight: Math.min(8, IN_FLIGHT),
      fieldOf: (v) => `line ${v.line}: ${v.field}`,
      at: new Date(),
    });
    const stored = performance.now();
    app.evaluationRunner.wake();
    for (;;) {
      const row = await db("evaluations").where({ id: evaluation.id }).first("state", "done", "failed");
      if (row.state === "finished") {
        if (row.failed > 0) throw new Error(`${row.failed} examples failed`);
        break;
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const ran = performance.now();
    const examplesPerSecond = EXAMPLES / ((ran - stored) / 1000);
    console.log(`evaluation bench: 1 noul question, upstream answers at once, ${IN_FLIGHT} in flight, ${app.database.kind} store, Node ${process.version}`);
    console.log(`  metered decisions (${IN_FLIGHT} conn, ${DURATION_S} s)   ${decisions.requests.average.toFixed(0).padStart(6)} /s   1.00 (baseline)`);
    console.log(`  evaluation examples (${EXAMPLES})             ${examplesPerSecond.toFixed(0).padStart(6)} /s   ${(examplesPerSecond / decisions.requests.average).toFixed(2)} of decisions/s`);
    console.log(`  storing the ${EXAMPLES} examples (one transaction)  ${(stored - started).toFixed(0)} ms`);
  } finally {
    await app.stop();
    await fake.close();
    await store.cleanup();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
