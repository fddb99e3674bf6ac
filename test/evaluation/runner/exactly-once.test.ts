import { fromJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createEvaluation } from "../../../src/evaluation/evaluations.js";
import { cancelEvaluation, claimExamples, finishExample, releaseOrphanedExamples, type ClaimedExample } from "../../../src/evaluation/store.js";
import { QuestionSchema } from "../../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { admitExampleHold } from "../../../src/metering/evaluation-holds.js";
import { decisionReserveUnits } from "../../../src/metering/meter.js";
import { balanceUnits, createTestAccount } from "../../support/app.js";
import { createTestDatabase, type TestDatabase } from "../../support/database.js";
import { assertInvariants } from "../../support/invariants.js";
import { waitFor } from "../../support/wait.js";

/**
 * The runner's exactly-once rule on the store itself, with two replicas
 * played by two lease tokens on one database: a replica that dies after its
 * hold (and after the upstream answered) leaves the example to the next,
 * which settles that same hold once; the late replica records and charges
 * nothing. No service process: each step is the store function the runner calls.
 */

let database: TestDatabase;
const RESERVE = decisionReserveUnits(1);

beforeAll(async () => {
  database = await createTestDatabase(10, { runsEvaluations: true });
});
afterAll(async () => {
  await database?.close();
});

async function evaluationOf(examples: number, examplesInFlight = 8) {
  const { accountId } = await createTestAccount(database.db, { units: 1_000_000 });
  const row = await createEvaluation(database.db, {
    accountId,
    createdBy: "operator",
    name: "",
    questions: { urgent: fromJson(QuestionSchema, { type: "noul", instructions: "Is it urgent?" }) },
    examples: Array.from({ length: examples }, (_, i) => ({ line: i + 1, state: JSON.stringify(`ticket ${i}`), labels: { urgent: fromJson(ValueSchema, i % 2 === 0) } })),
    capUnits: 1_000_000,
    examplesInFlight,
    fieldOf: (v) => `line ${v.line}: ${v.field}`,
    at: new Date(),
  });
  return { accountId, evaluationId: row.id };
}

/** Claims until the example at `position` comes back (its earlier lease has run out on the database's clock). */
async function takeOver(position: number, token: string): Promise<ClaimedExample> {
  let taken: ClaimedExample | undefined;
  await waitFor(async () => {
    taken = (await claimExamples(database.db, { max: 8, leaseMs: 60_000, token })).find((c) => c.position === position);
    return taken !== undefined;
  }, "the example's lease to run out");
  return taken!;
}

const answered = (chargeUnits: number) => ({ kind: "answered" as const, answers: { urgent: { type: "noul", noul: 0.7 } }, chargeUnits, upstream: "fake-model", promptVersion: "p1" });

describe("an example whose replica died", () => {
  it("is taken with its hold by the next replica, settled once, and the late replica charges nothing", async () => {
    const { accountId, evaluationId } = await evaluationOf(1);
    const [first] = await claimExamples(database.db, { max: 1, leaseMs: 1, token: crypto.randomUUID() });
    expect(first!.evaluationId).toBe(evaluationId);
    expect(await admitExampleHold(database.db, { evaluationId, requestId: first!.requestId, reserveUnits: RESERVE })).toMatchObject({ outcome: "admitted" });
    // The first replica stops here (its upstream answered; nothing was recorded).

    const second = await takeOver(first!.position, crypto.randomUUID());
    expect([second.requestId, second.attempts]).toEqual([first!.requestId, 2]);
    expect(await admitExampleHold(database.db, { evaluationId, requestId: second.requestId, reserveUnits: RESERVE })).toMatchObject({ outcome: "admitted" });
    expect(Number((await database.db("accounts").where({ id: accountId }).first("reserved")).reserved)).toBe(RESERVE);

    expect(await finishExample(database.db, second, answered(150))).toBe(true);
    expect(await finishExample(database.db, first!, answered(150))).toBe(false);

    const holds = await database.db("requests").where({ evaluation_id: evaluationId }).select("status", "charged");
    expect(holds).toEqual([{ status: "settled", charged: 150 }]);
    const entries = await database.db("ledger").where({ request_id: first!.requestId }).orderBy("id").pluck("kind");
    expect(entries).toEqual(["hold", "settle"]);
    expect(await balanceUnits(database.db, accountId)).toBe(1_000_000 - 150);
    const evaluation = await database.db("evaluations").where({ id: evaluationId }).first("state", "done", "charged_units", "held_units");
    expect(evaluation).toMatchObject({ state: "finished", done: 1 });
    expect([Number(evaluation.charged_units), Number(evaluation.held_units)]).toEqual([150, 0]);
    await assertInvariants(database.db, accountId);
  });

  it("gives its hold back when the evaluation was cancelled meanwhile, and nobody runs it", async () => {
    const { accountId, evaluationId } = await evaluationOf(1);
    const [first] = await claimExamples(database.db, { max: 1, leaseMs: 1, token: crypto.randomUUID() });
    await admitExampleHold(database.db, { evaluationId, requestId: first!.requestId, reserveUnits: RESERVE });
    await cancelEvaluation(database.db, accountId, evaluationId);
    await waitFor(async () => (await releaseOrphanedExamples(database.db)) > 0, "the orphaned hold to be released");
    expect(await database.db("requests").where({ id: first!.requestId }).first("status")).toEqual({ status: "released" });
    expect(Number((await database.db("accounts").where({ id: accountId }).first("reserved")).reserved)).toBe(0);
    expect(await claimExamples(database.db, { max: 8, leaseMs: 60_000, token: crypto.randomUUID() }).then((c) => c.filter((x) => x.evaluationId === evaluationId))).toEqual([]);
    expect(await finishExample(database.db, first!, answered(150))).toBe(false);
    await assertInvariants(database.db, accountId);
  });
});

/** The activity lines the runner wrote for this evaluation. */
async function runnerLines(evaluationId: string) {
  return database.db("account_activity").where("detail", "like", `${evaluationId}:%`).where({ actor: "system" }).orderBy("id").select("kind", "detail");
}

describe("the activity line of an evaluation that stops or finishes by itself", () => {
  it("is written once for a finish, when the last examples finish at once and the runner's finishing step is tried again", async () => {
    const { evaluationId } = await evaluationOf(3);
    const claimed = (await claimExamples(database.db, { max: 8, leaseMs: 60_000, token: crypto.randomUUID() })).filter((c) => c.evaluationId === evaluationId);
    expect(claimed).toHaveLength(3);
    for (const c of claimed) await admitExampleHold(database.db, { evaluationId, requestId: c.requestId, reserveUnits: RESERVE });
    expect(await finishExample(database.db, claimed[0]!, answered(100))).toBe(true);
    expect(await runnerLines(evaluationId)).toEqual([]);
    // The last two finish together; each is then tried again, as after a lost answer to its commit.
    expect(await Promise.all([finishExample(database.db, claimed[1]!, answered(100)), finishExample(database.db, claimed[2]!, { kind: "failed", error: "upstream_error" })])).toEqual([true, true]);
    expect(await Promise.all(claimed.map((c) => finishExample(database.db, c, answered(100))))).toEqual([false, false, false]);
    expect(await runnerLines(evaluationId)).toEqual([{ kind: "evaluation_finished", detail: `${evaluationId}: finished by the evaluation runner: 2 answered, 1 failed, of 3; charged 0.0002 credits, cap 1 credits` }]);
  });

  it("is written once for a stop, when several examples in flight are refused and each refusal is recorded twice", async () => {
    const { evaluationId } = await evaluationOf(4);
    const claimed = (await claimExamples(database.db, { max: 8, leaseMs: 60_000, token: crypto.randomUUID() })).filter((c) => c.evaluationId === evaluationId);
    const stop = { kind: "stopped" as const, reason: "CREDIT_CAP" as const };
    expect((await Promise.all(claimed.map((c) => finishExample(database.db, c, stop)))).every(Boolean)).toBe(true);
    expect(await Promise.all(claimed.map((c) => finishExample(database.db, c, stop)))).toEqual([false, false, false, false]);
    expect(await runnerLines(evaluationId)).toEqual([
      { kind: "evaluation_stopped", detail: `${evaluationId}: stopped by the evaluation runner: its credit cap was reached (CREDIT_CAP); 0 of 4 examples run; charged 0 credits, cap 1 credits` },
    ]);
  });

  it("is not written when the evaluation was cancelled before its last example finished", async () => {
    const { accountId, evaluationId } = await evaluationOf(1);
    const [claimed] = (await claimExamples(database.db, { max: 8, leaseMs: 60_000, token: crypto.randomUUID() })).filter((c) => c.evaluationId === evaluationId);
    await admitExampleHold(database.db, { evaluationId, requestId: claimed!.requestId, reserveUnits: RESERVE });
    await cancelEvaluation(database.db, accountId, evaluationId);
    expect(await finishExample(database.db, claimed!, answered(100))).toBe(true);
    expect(await finishExample(database.db, claimed!, { kind: "stopped", reason: "INSUFFICIENT_BALANCE" })).toBe(false);
    expect(await runnerLines(evaluationId)).toEqual([]);
  });
});

describe("two replicas claiming at once", () => {
  it("never take the same example, and together take no more than the evaluation's examples in flight", async () => {
    const { evaluationId } = await evaluationOf(12, 5);
    const [a, b] = await Promise.all([
      claimExamples(database.db, { max: 4, leaseMs: 60_000, token: crypto.randomUUID() }),
      claimExamples(database.db, { max: 4, leaseMs: 60_000, token: crypto.randomUUID() }),
    ]);
    const positions = [...a!, ...b!].filter((c) => c.evaluationId === evaluationId).map((c) => c.position);
    expect(new Set(positions).size).toBe(positions.length);
    expect(positions.length).toBe(5);
  });
});
