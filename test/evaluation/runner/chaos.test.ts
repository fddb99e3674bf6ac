import { fromJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createKnex, migrate } from "../../../src/db/database.js";
import { createEvaluation } from "../../../src/evaluation/evaluations.js";
import { QuestionSchema } from "../../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { balanceUnits, createTestAccount } from "../../support/app.js";
import { isProbe, logprobsReply, PROBE_OK, startFakeLlm, type FakeLlm } from "../../support/fake-llm.js";
import { assertInvariants } from "../../support/invariants.js";
import { startPrivateCluster, type PrivateCluster } from "../../support/private-cluster.js";
import { startServiceProcess, type ServiceProcess } from "../../support/process.js";
import { waitFor } from "../../support/wait.js";

/**
 * Chaos for the evaluation runner: 500 examples run by a service process
 * that is killed with SIGKILL mid-run, then PostgreSQL crashes (an immediate
 * stop and a start with WAL recovery, on a private cluster), then a second
 * service process finishes the run. Every example ends answered once and
 * charged exactly once; no hold is left.
 */
let cluster: PrivateCluster;
let db: ReturnType<typeof createKnex>;
let fake: FakeLlm;
const services: ServiceProcess[] = [];
const PROMPT_TOKENS = 77;
const EXAMPLES = 500;

beforeAll(async () => {
  cluster = await startPrivateCluster();
  db = createKnex(cluster.url, 4);
  await migrate(db, { useAdvisoryLock: true });
  // The documented response shape (fake-llm.ts), a little late, so that the kill finds examples in flight.
  fake = await startFakeLlm((request) => (isProbe(request.body) ? PROBE_OK : { ...logprobsReply({ yes: 0.7, no: 0.3 }, { prompt: PROMPT_TOKENS }), delayMs: 15 }));
}, 120_000);
afterAll(async () => {
  for (const service of services) await service.stop("SIGKILL").catch(() => undefined);
  await fake?.close();
  await db?.destroy();
  cluster?.stop();
});

const serviceEnv = () => ({
  DATABASE_URL: cluster.url,
  TYPESAFE_LOG_LEVEL: "info",
  TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
  TYPESAFE_LLM_MODEL: "fake-model",
  TYPESAFE_LLM_REQUEST_TIMEOUT_MS: "2000",
  TYPESAFE_LEASE_MARGIN_MS: "1000",
  TYPESAFE_EVALUATION_EXAMPLES_IN_FLIGHT: "8",
  TYPESAFE_EVALUATION_POLL_MS: "50",
});

describe("an evaluation across kill -9 of the service and a PostgreSQL crash", () => {
  it("runs every example once and charges each exactly once", async () => {
    const grantUnits = 100_000_000;
    const { accountId } = await createTestAccount(db, { units: grantUnits });
    const evaluation = await createEvaluation(db, {
      accountId,
      createdBy: "operator",
      name: "chaos",
      questions: { urgent: fromJson(QuestionSchema, { type: "noul", instructions: "Is it urgent?" }) },
      examples: Array.from({ length: EXAMPLES }, (_, i) => ({ line: i + 1, state: JSON.stringify(`ticket ${i}`), labels: { urgent: fromJson(ValueSchema, i % 3 === 0) } })),
      capUnits: 50_000_000,
      examplesInFlight: 8,
      fieldOf: (v) => `line ${v.line}: ${v.field}`,
      at: new Date(),
    });
    const progress = async () => (await db("evaluations").where({ id: evaluation.id }).first("done", "failed", "state")) as { done: number; failed: number; state: string };

    const first = await startServiceProcess(serviceEnv());
    services.push(first);
    await waitFor(async () => (await progress()).done >= 100, "a hundred examples", 60_000);
    await first.stop("SIGKILL");
    const heldAtKill = await db("requests").where({ evaluation_id: evaluation.id, status: "active" });
    cluster.crash();

    const second = await startServiceProcess(serviceEnv());
    services.push(second);
    await waitFor(async () => (await progress().catch(() => ({ state: "" }))).state === "finished", "the evaluation to finish", 120_000);

    expect(await progress()).toEqual({ done: EXAMPLES, failed: 0, state: "finished" });
    const examples = await db("evaluation_examples").where({ evaluation_id: evaluation.id }).select("status", "request_id", "charged_units");
    expect(examples.every((e) => e.status === "done" && Number(e.charged_units) === PROMPT_TOKENS)).toBe(true);
    const settled = await db("requests").where({ evaluation_id: evaluation.id, status: "settled" }).select("id", "charged");
    expect(settled).toHaveLength(EXAMPLES);
    expect(new Set(settled.map((r) => r.id))).toEqual(new Set(examples.map((e) => e.request_id)));
    expect(await db("requests").where({ evaluation_id: evaluation.id, status: "active" })).toEqual([]);
    const settles = await db("ledger").where({ account_id: accountId, kind: "settle" }).select("request_id", "amount");
    expect(settles).toHaveLength(EXAMPLES);
    expect(new Set(settles.map((s) => s.request_id)).size).toBe(EXAMPLES);
    expect(await balanceUnits(db, accountId)).toBe(grantUnits - EXAMPLES * PROMPT_TOKENS);
    expect(Number((await db("accounts").where({ id: accountId }).first("reserved")).reserved)).toBe(0);
    await assertInvariants(db, accountId);
    // The kill left holds in flight, which the second process settled as they were: none was held twice.
    expect(heldAtKill.length).toBeGreaterThan(0);
    expect(heldAtKill.every((h) => settled.some((s) => s.id === h.id))).toBe(true);
  }, 240_000);
});
