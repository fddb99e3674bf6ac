import { Code } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { accountClient, inviteMember, refusal, startAccountApp, uniqueEmail, type AccountClient, type AccountTestApp } from "./support.js";

/**
 * Another account's evaluation is answered exactly as one that does not
 * exist, for every evaluation RPC, and nothing of it changes.
 */
let database: TestDatabase;
let service: AccountTestApp;
const PASSWORD = "a long and unusual passphrase 42";

beforeAll(async () => {
  database = await createTestDatabase();
  service = await startAccountApp(database);
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

async function owner(): Promise<AccountClient> {
  const { accountId } = await createTestAccount(database.db, { units: 1_000_000 });
  const { token } = await inviteMember(database.db, accountId, uniqueEmail("owner"), service.clock.now(), "owner");
  const { client } = accountClient(service.url);
  await client.acceptInvite({ inviteToken: token, password: PASSWORD });
  return client;
}

const calls: Array<[string, (c: AccountClient, id: string) => Promise<unknown>]> = [
  ["getEvaluation", (c, id) => c.getEvaluation({ evaluationId: id })],
  ["getEvaluationResults", (c, id) => c.getEvaluationResults({ evaluationId: id })],
  ["cancelEvaluation", (c, id) => c.cancelEvaluation({ evaluationId: id })],
  ["resumeEvaluation", (c, id) => c.resumeEvaluation({ evaluationId: id })],
  ["deleteEvaluation", (c, id) => c.deleteEvaluation({ evaluationId: id })],
  ["fitCalibration", (c, id) => c.fitCalibration({ evaluationId: id, questionKey: "urgent", method: "platt" })],
];

describe("another account's evaluation", () => {
  it.each(calls)("%s: NOT_FOUND, the same answer as for an id that does not exist or is malformed", async (_name, call) => {
    const mine = await owner();
    const theirs = await owner();
    const { evaluation } = await theirs.createEvaluation({
      questions: { urgent: { type: "noul", instructions: "Is it urgent?" } },
      examples: [{ state: { kind: { case: "stringValue", value: "the site is down" } }, labels: { urgent: { kind: { case: "boolValue", value: true } } } }],
      creditCapCredits: 1,
    });
    const answers = await Promise.all([evaluation!.id, crypto.randomUUID(), "not-a-uuid"].map(async (id) => refusal(call(mine, id))));
    for (const answer of answers) expect([answer.code, answer.reason, answer.message, answer.field]).toEqual([Code.NotFound, "NOT_FOUND", "no such evaluation", "evaluation_id"]);
    expect((await mine.listEvaluations({})).evaluations).toEqual([]);
    expect((await theirs.getEvaluation({ evaluationId: evaluation!.id })).evaluation!.state).toBe("running");
  });
});
