import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { refundHandler, startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { runAdmin } from "../support/process.js";
import { waitFor } from "../support/wait.js";

/**
 * The operator's evaluation commands, run as the operator runs them (a
 * process of their own) against the database of a service whose runner does
 * the work: a JSONL and a CSV upload, a refused file naming each bad line,
 * show, and the results as JSON and as CSV with the formula guard.
 */
let database: TestDatabase;
let service: TestApp;
let fake: FakeLlm;
let dir: string;

beforeAll(async () => {
  database = await createTestDatabase(10, { runsEvaluations: true });
  fake = await startFakeLlm(refundHandler);
  service = await startTestApp(database, { TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_LLM_MODEL: "fake-model", TYPESAFE_EVALUATION_EXAMPLES_IN_FLIGHT: "4", TYPESAFE_EVALUATION_POLL_MS: "50" });
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-evals-"));
  await fs.writeFile(path.join(dir, "questions.json"), JSON.stringify({ "=refund": { type: "noul", instructions: "Does the customer want their money back?" } }));
});
afterAll(async () => {
  await service?.stop();
  await fake?.close();
  await database?.close();
  await fs.rm(dir, { recursive: true, force: true });
});

const admin = async (args: string[]) => {
  const result = await runAdmin(args, { DATABASE_URL: database.url });
  return { ...result, json: result.code === 0 && !args.includes("--csv") ? JSON.parse(result.stdout) : undefined };
};

async function untilFinished(id: string) {
  await waitFor(async () => (await admin(["evals", "show", "--evaluation", id])).json.state === "finished", "the evaluation to finish", 30_000);
}

describe("operator CLI: evals", () => {
  it("creates from JSONL, shows progress, and prints results as JSON and as guarded CSV", async () => {
    const { accountId } = await createTestAccount(database.db, { units: 5_000_000 });
    const lines = [
      { state: "I want a refund for order 1", labels: { "=refund": true } },
      { state: "Where is my parcel?", labels: { "=refund": false } },
      { state: { ticket: "refund please" }, labels: { "=refund": false } },
    ];
    await fs.writeFile(path.join(dir, "a.jsonl"), lines.map((l) => JSON.stringify(l)).join("\n") + "\n");
    const created = await admin(["evals", "create", "--account", accountId, "--questions", path.join(dir, "questions.json"), "--file", path.join(dir, "a.jsonl"), "--cap", "1"]);
    expect(created.json).toMatchObject({ state: "running", progress: { total: 3 }, credit_cap_credits: 1, created_by: "operator" });
    await untilFinished(created.json.id);
    const shown = await admin(["evals", "show", "--evaluation", created.json.id]);
    expect(shown.json).toMatchObject({ state: "finished", progress: { total: 3, done: 3 }, charged_credits: 0.00027 });

    const results = await admin(["evals", "results", "--evaluation", created.json.id]);
    expect(results.json.questions["=refund"]).toMatchObject({ type: "noul", labelled: 3, answered: 3, metrics: { accuracy: 2 / 3 } });
    const csv = await admin(["evals", "results", "--evaluation", created.json.id, "--csv"]);
    const [header, row] = csv.stdout.split("\r\n");
    expect(header).toBe("question,type,labelled,answered,accuracy,brier,log_loss,ece,auroc,macro_f1,mae_steps,model,upstream,prompt_version");
    // A key starting with "=" would be a formula in a spreadsheet: quoted with a leading apostrophe, as usage.csv does.
    expect(row!.startsWith(`"'=refund",noul,3,3,0.666`)).toBe(true);

    // `activity` lists the runner's finish, by the system, with what was spent against the cap.
    const listed = await admin(["activity", "--account", accountId]);
    const events = (listed.json.events as Array<{ kind: string; actor: string; detail: string }>).filter((e) => e.kind.startsWith("evaluation_"));
    expect(events.map((e) => [e.kind, e.actor, e.detail])).toEqual([
      ["evaluation_finished", "system", `${created.json.id}: finished by the evaluation runner: 3 answered, 0 failed, of 3; charged 0.00027 credits, cap 1 credits`],
      ["evaluation_created", "operator", `${created.json.id}: 3 examples, cap 1 credits`],
    ]);

    // The activity log says which evaluation went and what it had spent.
    expect((await admin(["evals", "delete", "--evaluation", created.json.id])).json).toEqual({ deleted: true, evaluation_id: created.json.id });
    const activity = await database.db("account_activity").where({ account_id: accountId, kind: "evaluation_deleted" }).select("actor", "detail");
    expect(activity).toEqual([{ actor: "operator", detail: `${created.json.id}: charged 0.00027 credits, cap 1 credits` }]);
  }, 120_000);

  it("creates from CSV (an empty cell labels nothing) and refuses a bad file whole, naming every bad line", async () => {
    const { accountId } = await createTestAccount(database.db, { units: 5_000_000 });
    await fs.writeFile(path.join(dir, "b.csv"), 'state,=refund\n"refund, now",true\nhello,\n');
    const created = await admin(["evals", "create", "--account", accountId, "--questions", path.join(dir, "questions.json"), "--file", path.join(dir, "b.csv"), "--cap", "1"]);
    expect(created.code).toBe(2);
    expect(created.stderr).toContain("line 3: labels: must label at least one question");

    await fs.writeFile(path.join(dir, "c.csv"), 'state,=refund\n"refund, now",true\n"where, now",false\n');
    const ok = await admin(["evals", "create", "--account", accountId, "--questions", path.join(dir, "questions.json"), "--file", path.join(dir, "c.csv"), "--cap", "1"]);
    expect(ok.json).toMatchObject({ progress: { total: 2 } });
    await untilFinished(ok.json.id);

    await fs.writeFile(path.join(dir, "bad.jsonl"), ['{"state": "a", "labels": {"=refund": "yes"}}', "not json", '{"state": "", "labels": {"=refund": true}}', '{"state": "b", "labels": {"=refund": true}}'].join("\n"));
    const refused = await admin(["evals", "create", "--account", accountId, "--questions", path.join(dir, "questions.json"), "--file", path.join(dir, "bad.jsonl"), "--cap", "1"]);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain("line 2: must be one JSON object");
    await fs.writeFile(path.join(dir, "bad3.jsonl"), ['{"state": "a", "labels": {"=refund": "yes"}}', '{"state": "", "labels": {"=refund": true}}'].join("\n"));
    const third = await admin(["evals", "create", "--account", accountId, "--questions", path.join(dir, "questions.json"), "--file", path.join(dir, "bad3.jsonl"), "--cap", "1"]);
    expect(third.stderr).toContain("line 1: labels[\"=refund\"]: a noul label must be true or false");
    expect(third.stderr).toContain("line 2: state: must not be empty");
    expect(await database.db("evaluations").where({ account_id: accountId })).toHaveLength(1);
  }, 120_000);
});
