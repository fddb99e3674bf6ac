import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestDatabase, type TestDatabase } from "../../support/database.js";
import { balanceUnits, createTestAccount } from "../../support/app.js";
import { assertInvariants } from "../../support/invariants.js";
import { isProbe, logprobsReply, PROBE_OK, startFakeLlm, userContent, type FakeLlm } from "../../support/fake-llm.js";
import { waitFor } from "../../support/wait.js";
import { accountClient, inviteMember, refusal, startAccountApp, uniqueEmail, type AccountClient, type AccountTestApp } from "../../session-door/support.js";
import { decisionReserveUnits } from "../../../src/metering/meter.js";
import { seededRandom } from "../../../src/evaluation/seeded-random.js";

/**
 * An evaluation end to end: the real service, a real fake upstream (the
 * OpenAI-compatible fake, whose replies have the documented shape), the
 * account area's client, and PostgreSQL. The fake answers noul with a known
 * distortion of the true log-odds (3 × true + 1) for a state that carries its
 * true probability, so the evaluation must find it miscalibrated.
 */

let database: TestDatabase;
let fake: FakeLlm;
let service: AccountTestApp;
const PASSWORD = "a long and unusual passphrase 42";
const PROMPT_TOKENS = 120;
/** What the fake reports for a state marked "expensive": a third of a hold (32,000 units). */
const EXPENSIVE_TOKENS = 10_000;

const logit = (p: number) => Math.log(p / (1 - p));
const sigmoid = (x: number) => 1 / (1 + Math.exp(-x));

beforeAll(async () => {
  database = await createTestDatabase(10, { runsEvaluations: true });
  fake = await startFakeLlm((request) => {
    if (isProbe(request.body)) return PROBE_OK;
    const match = /true probability (0\.\d+)/.exec(userContent(request));
    if (!match) return { status: 400, text: "no route" };
    const q = sigmoid(3 * logit(Number(match[1])) + 1);
    return logprobsReply({ yes: q, no: 1 - q }, { prompt: userContent(request).includes("expensive") ? EXPENSIVE_TOKENS : PROMPT_TOKENS });
  });
  service = await startAccountApp(database, {
    TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
    TYPESAFE_LLM_MODEL: "fake-model",
    TYPESAFE_EVALUATION_EXAMPLES_IN_FLIGHT: "8",
    TYPESAFE_EVALUATION_POLL_MS: "50",
  });
});
afterAll(async () => {
  await service?.stop();
  await fake?.close();
  await database?.close();
});

async function owner(units: number): Promise<{ accountId: string; client: AccountClient }> {
  const { accountId } = await createTestAccount(database.db, { units });
  const { token } = await inviteMember(database.db, accountId, uniqueEmail("owner"), service.clock.now(), "owner");
  const { client } = accountClient(service.url);
  await client.acceptInvite({ inviteToken: token, password: PASSWORD });
  return { accountId, client };
}

function labelledStates(count: number, seed: number, marker = "ticket") {
  const random = seededRandom(seed);
  return Array.from({ length: count }, (_, i) => {
    const p = 0.02 + 0.96 * random();
    const label = random() < p;
    return {
      state: { kind: { case: "stringValue" as const, value: `${marker} ${i}: true probability ${p.toFixed(4)}` } },
      labels: { urgent: { kind: { case: "boolValue" as const, value: label } } },
    };
  });
}

const QUESTIONS = { urgent: { type: "noul", instructions: "Is it urgent?" } };

async function finished(client: AccountClient, evaluationId: string, states = ["finished"]) {
  let last = "";
  await waitFor(
    async () => {
      const { evaluation } = await client.getEvaluation({ evaluationId });
      last = evaluation!.state;
      return states.includes(last);
    },
    `the evaluation to reach ${states.join(" or ")}`,
    100_000,
  );
  return (await client.getEvaluation({ evaluationId })).evaluation!;
}

/** The account's activity lines about this evaluation, oldest first, as ListActivity gives them. */
async function activityOf(client: AccountClient, evaluationId: string) {
  const { events } = await client.listActivity({ pageSize: 500 });
  return events
    .filter((e) => e.detail.startsWith(`${evaluationId}:`))
    .reverse()
    .map((e) => ({ kind: e.kind, actor: e.actor, detail: e.detail }));
}

describe("an evaluation of a deliberately miscalibrated upstream", () => {
  it("runs every example once, charges each once, and reports ECE above 0.1", async () => {
    const grant = 100_000_000;
    const { accountId, client } = await owner(grant);
    const examples = labelledStates(300, 42);
    const { evaluation } = await client.createEvaluation({ name: "miscalibrated", questions: QUESTIONS, examples, creditCapCredits: 50, examplesInFlight: 8 });
    expect(evaluation!.progress!.total).toBe(300);
    const done = await finished(client, evaluation!.id);
    expect(done.progress).toMatchObject({ total: 300, done: 300, failed: 0 });
    expect(done.chargedCredits).toBeCloseTo((300 * PROMPT_TOKENS) / 1_000_000, 9);

    // Each example asked once (no retries here), one hold per example, each settled once.
    expect(fake.questionRequests().filter((r) => userContent(r).includes("true probability"))).toHaveLength(300);
    const holds = await database.db("requests").where({ evaluation_id: evaluation!.id }).select("status", "charged", "reserved");
    expect(holds).toHaveLength(300);
    expect(holds.every((h) => h.status === "settled" && Number(h.charged) === PROMPT_TOKENS && Number(h.reserved) === decisionReserveUnits(1))).toBe(true);
    const settles = await database.db("ledger").where({ account_id: accountId, kind: "settle" }).sum({ total: "amount" }).first();
    expect(await balanceUnits(database.db, accountId)).toBe(grant - Number(settles!.total));
    expect(Number(settles!.total)).toBe(300 * PROMPT_TOKENS);
    const account = await database.db("accounts").where({ id: accountId }).first("reserved", "in_flight");
    expect([Number(account.reserved), account.in_flight]).toEqual([0, 0]);
    await assertInvariants(database.db, accountId);

    const results = await client.getEvaluationResults({ evaluationId: evaluation!.id });
    const urgent = results.questions["urgent"]!;
    expect([urgent.type, urgent.labelled, urgent.answered]).toEqual(["noul", 300, 300]);
    expect(urgent.metrics["ece"]).toBeGreaterThan(0.1);
    expect(urgent.reliability).toHaveLength(10);
    expect(urgent.reliability.reduce((n, b) => n + b.count, 0)).toBe(300);
    expect(urgent.largestErrors.length).toBeGreaterThan(0);
    expect([results.upstream, results.promptVersion === "", results.model]).toEqual(["fake-model", false, "typesafe/service-1.13"]);

    // The usage shows which evaluation spent what.
    const usage = await client.listUsage({ pageSize: 500 });
    const ofEvaluation = usage.records.filter((r) => r.evaluationId === evaluation!.id);
    expect(ofEvaluation).toHaveLength(300);

    // The finish is in the activity once, by the system, with what was spent against the cap.
    expect((await activityOf(client, evaluation!.id)).slice(1)).toEqual([
      { kind: "evaluation_finished", actor: "system", detail: `${evaluation!.id}: finished by the evaluation runner: 300 answered, 0 failed, of 300; charged 0.036 credits, cap 50 credits` },
    ]);
  }, 120_000);

  it("waits while its own holds are out, stops at its credit cap with reason CREDIT_CAP, and finishes after a resume with a higher cap", async () => {
    const { accountId, client } = await owner(100_000_000);
    // Holds are 32,000 units, charges 10,000: with a cap of 50,000 one hold fits at a time; after two charges none does.
    const { evaluation } = await client.createEvaluation({ questions: QUESTIONS, examples: labelledStates(20, 7, "expensive"), creditCapCredits: 0.05, examplesInFlight: 2 });
    const stopped = await finished(client, evaluation!.id, ["stopped"]);
    expect([stopped.stopReason, stopped.progress!.done, stopped.chargedCredits]).toEqual(["CREDIT_CAP", 2, 0.02]);
    const resumed = await client.resumeEvaluation({ evaluationId: evaluation!.id, creditCapCredits: 5 });
    expect(resumed.evaluation!.state).toBe("running");
    const done = await finished(client, evaluation!.id);
    expect(done.progress).toMatchObject({ done: 20, failed: 0 });
    expect(done.chargedCredits).toBeCloseTo(0.2, 9);
    expect(await database.db("requests").where({ evaluation_id: evaluation!.id, status: "settled" })).toHaveLength(20);
    await assertInvariants(database.db, accountId);
    // Two examples in flight met the cap: one stop, one line; then the member's resume and the runner's finish.
    const id = evaluation!.id;
    expect(await activityOf(client, id)).toEqual([
      expect.objectContaining({ kind: "evaluation_created" }),
      { kind: "evaluation_stopped", actor: "system", detail: `${id}: stopped by the evaluation runner: its credit cap was reached (CREDIT_CAP); 2 of 20 examples run; charged 0.02 credits, cap 0.05 credits` },
      expect.objectContaining({ kind: "evaluation_resumed", actor: expect.stringContaining("@") }),
      { kind: "evaluation_finished", actor: "system", detail: `${id}: finished by the evaluation runner: 20 answered, 0 failed, of 20; charged 0.2 credits, cap 5 credits` },
    ]);
  });

  it("stops with INSUFFICIENT_BALANCE when the account runs dry, holding nothing, and never goes below zero", async () => {
    // 70,000 units: four examples of 10,000 are charged, then 30,000 is left, less than one hold.
    const { accountId, client } = await owner(70_000);
    const { evaluation } = await client.createEvaluation({ questions: QUESTIONS, examples: labelledStates(40, 9, "expensive"), creditCapCredits: 10, examplesInFlight: 4 });
    const stopped = await finished(client, evaluation!.id, ["stopped"]);
    expect([stopped.stopReason, stopped.progress!.done]).toEqual(["INSUFFICIENT_BALANCE", 4]);
    expect(await database.db("requests").where({ evaluation_id: evaluation!.id, status: "active" })).toHaveLength(0);
    const account = await database.db("accounts").where({ id: accountId }).first("reserved", "balance");
    expect([Number(account.reserved), Number(account.balance)]).toEqual([0, 30_000]);
    await assertInvariants(database.db, accountId);
    expect((await activityOf(client, evaluation!.id)).slice(1)).toEqual([
      {
        kind: "evaluation_stopped",
        actor: "system",
        detail: `${evaluation!.id}: stopped by the evaluation runner: the account's balance ran out (INSUFFICIENT_BALANCE); 4 of 40 examples run; charged 0.04 credits, cap 10 credits`,
      },
    ]);
  });

  it("refuses a bad example set whole, naming every bad line and field, and stores nothing", async () => {
    const { accountId, client } = await owner(1_000_000);
    const good = labelledStates(3, 1);
    const refused = await refusal(
      client.createEvaluation({
        questions: QUESTIONS,
        examples: [
          good[0]!,
          { state: { kind: { case: "stringValue", value: " " } }, labels: good[1]!.labels },
          { state: good[2]!.state, labels: { urgent: { kind: { case: "stringValue", value: "yes" } }, other: { kind: { case: "boolValue", value: true } } } },
        ],
        creditCapCredits: 1,
      }),
    );
    expect([refused.reason, refused.field]).toEqual(["INVALID_ARGUMENT", "examples[1].state"]);
    expect(refused.detailMetadata["violations"]!.split("\n")).toEqual([
      "examples[1].state: must not be empty",
      "examples[2].labels.urgent: a noul label must be true or false",
      'examples[2].labels.other: not a question key (urgent)',
    ]);
    expect(await database.db("evaluations").where({ account_id: accountId })).toHaveLength(0);
  });
});
