import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { extendExampleLease, insertEvaluation } from "../../../src/evaluation/store.js";
import { createModelPace } from "../../../src/upstream/model-pace.js";
import { balanceUnits, createTestAccount, startTestApp, type TestApp } from "../../support/app.js";
import { createTestDatabase, type TestDatabase } from "../../support/database.js";
import { assertInvariants } from "../../support/invariants.js";
import { tinyModelSettings, writeTinyGguf } from "../../support/tiny-gguf.js";
import { waitFor } from "../../support/wait.js";

/**
 * An evaluation on the embedded model gets the deadline a Decide call of the
 * same questions gets: what its tokens and those queued ahead need at the
 * measured rate (embedded-deadline.ts), not the configured deadline alone.
 * The service runs the tiny GGUF model the tests make, with a configured
 * deadline (100 ms) far shorter than 40 long questions take: cut there, every
 * question would time out and the example would be retried, then failed.
 */

let database: TestDatabase;
let dir: string;
let service: TestApp;
// The pace's clock moves only when the test moves it: the rate the test gives it is the rate each example is planned with.
let paceNow = 0;
const pace = createModelPace({ now: () => paceNow });

/** Gives the pace one measurement: `tokensPerSecond` over one busy second. */
function measured(tokensPerSecond: number) {
  // What was measured before weighs nothing next to this one.
  for (let i = 0; i < 200; i++) pace.evaluating()(0);
  const ended = pace.evaluating();
  paceNow += 1_000;
  ended(tokensPerSecond);
}

const FORTY = Object.fromEntries(
  Array.from({ length: 40 }, (_, i) => [`q${i}`, { type: "noul", instructions: `Question ${i}: ${"is the customer asking for a refund of the second charge, and is it urgent? ".repeat(3)}` }]),
);

beforeAll(async () => {
  database = await createTestDatabase(10, { runsEvaluations: true });
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-eval-embedded-"));
  const modelFile = writeTinyGguf(path.join(dir, "tiny.gguf"));
  service = await startTestApp(
    database,
    {
      ...tinyModelSettings(modelFile, dir),
      TYPESAFE_LLM_REQUEST_TIMEOUT_MS: "100",
      TYPESAFE_LLM_EMBEDDED_MAX_WAIT_MS: "600000",
      TYPESAFE_LEASE_MARGIN_MS: "1000",
      TYPESAFE_EVALUATION_EXAMPLES_IN_FLIGHT: "2",
      TYPESAFE_EVALUATION_POLL_MS: "50",
    },
    { overrides: { modelPace: pace } },
  );
  await waitFor(
    async () => ((await (await fetch(`${service.url}/healthz`)).json()) as { data: { decisions?: { model_state?: string } } }).data.decisions?.model_state === "ready",
    "the model to load",
    30_000,
  );
}, 60_000);
afterAll(async () => {
  await service?.stop();
  await database?.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe("an evaluation on the embedded model", () => {
  it("runs each long example once, to the end, within the deadline its queue needs: answered, charged once, never retried", async () => {
    // A rate far slower than this machine's, even under a full test run: the two examples are given minutes, far past the 100 ms deadline.
    measured(100);
    const { accountId } = await createTestAccount(database.db, { units: 10_000_000 });
    const evaluation = await insertEvaluation(database.db, {
      accountId,
      name: "forty long questions",
      questions: FORTY,
      questionKeys: Object.keys(FORTY),
      capUnits: 10_000_000,
      examplesInFlight: 2,
      createdBy: "test",
      examples: [1, 2].map((position) => ({ position, state: JSON.stringify({ ticket: `case ${position}: I was charged twice for my pro plan` }), labels: { q0: true } })),
    });
    await waitFor(async () => (await database.db("evaluations").where({ id: evaluation.id }).first("state")).state === "finished", "the evaluation to finish", 240_000);

    const row = await database.db("evaluations").where({ id: evaluation.id }).first("done", "failed", "charged_units", "held_units");
    expect([row.done, row.failed, Number(row.held_units)]).toEqual([2, 0, 0]);
    const examples = await database.db("evaluation_examples").where({ evaluation_id: evaluation.id }).orderBy("position").select("attempts", "error", "answers", "charged_units");
    // Cut at the configured 100 ms, each question times out and the example is tried three times, then fails.
    expect(examples.map((e) => [e.attempts, e.error])).toEqual([
      [1, ""],
      [1, ""],
    ]);
    for (const e of examples) expect(Object.values(e.answers as Record<string, { type: string }>).filter((a) => a.type === "error")).toEqual([]);
    const charged = examples.reduce((sum, e) => sum + Number(e.charged_units), 0);
    expect(Number(row.charged_units)).toBe(charged);
    expect(await balanceUnits(database.db, accountId)).toBe(10_000_000 - charged);
    // Both examples gave their booked tokens back.
    expect(pace.queuedTokens()).toBe(0);
    await assertInvariants(database.db, accountId);
  }, 300_000);

  it("an example given a longer deadline holds its lease that much longer, so no replica takes it while it runs", async () => {
    const { accountId } = await createTestAccount(database.db, { units: 10_000_000 });
    const evaluation = await insertEvaluation(database.db, {
      accountId,
      name: "lease",
      questions: { q0: FORTY["q0"] },
      questionKeys: ["q0"],
      capUnits: 1_000_000,
      examplesInFlight: 1,
      createdBy: "test",
      examples: [{ position: 1, state: JSON.stringify("a ticket"), labels: { q0: true } }],
    });
    await database.db("evaluations").where({ id: evaluation.id }).update({ state: "stopped" });
    const leaseLeftMs = async () =>
      Number((await database.db.raw("SELECT extract(epoch FROM lease_until - clock_timestamp()) * 1000 AS ms FROM evaluation_examples WHERE evaluation_id = ?", [evaluation.id])).rows[0].ms);
    // Taken as claimExamples takes it (status running, a lease and its token), while the evaluation stays stopped so that this service's runner leaves it alone.
    const token = crypto.randomUUID();
    await database.db("evaluation_examples")
      .where({ evaluation_id: evaluation.id, position: 1 })
      .update({ status: "running", lease_token: token, lease_until: database.db.raw("clock_timestamp() + interval '1100 milliseconds'"), attempts: 1 });
    const claimed = [
      { evaluationId: evaluation.id, accountId, position: 1, state: "a ticket", labels: { q0: true }, questions: evaluation.questions, requestId: crypto.randomUUID(), attempts: 1, leaseToken: token },
    ];
    expect(await leaseLeftMs()).toBeLessThanOrEqual(1_100);
    expect(await extendExampleLease(database.db, claimed[0]!, 60_000)).toBe(true);
    expect(await leaseLeftMs()).toBeGreaterThan(55_000);
    // Never shortened; and an attempt that no longer holds the example extends nothing.
    expect(await extendExampleLease(database.db, claimed[0]!, 1_000)).toBe(true);
    expect(await leaseLeftMs()).toBeGreaterThan(55_000);
    expect(await extendExampleLease(database.db, { ...claimed[0]!, leaseToken: crypto.randomUUID() }, 120_000)).toBe(false);
    expect(await leaseLeftMs()).toBeLessThan(61_000);
  });
});
