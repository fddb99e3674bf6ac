import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { refundHandler, startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { runAdmin } from "../support/process.js";
import { waitFor } from "../support/wait.js";
import { accountClient, inviteMember, startAccountApp, uniqueEmail, type AccountClient, type AccountTestApp } from "./support.js";
import type { Role } from "../../src/team/roles.js";

/**
 * The results CSV of the account area: a finished evaluation's results as the
 * file `evals results --csv` prints (the same bytes), behind the same door as
 * usage.csv; another account's evaluation is the 404 of one that does not
 * exist, and a question key starting with "=" cannot become a formula.
 */
let database: TestDatabase;
let fake: FakeLlm;
let service: AccountTestApp;
const PASSWORD = "a long and unusual passphrase 42";
const PATH = "/account/v1/evaluations/results.csv";

beforeAll(async () => {
  database = await createTestDatabase(10, { runsEvaluations: true });
  fake = await startFakeLlm(refundHandler);
  service = await startAccountApp(database, {
    TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
    TYPESAFE_LLM_MODEL: "fake-model",
    TYPESAFE_EVALUATION_EXAMPLES_IN_FLIGHT: "4",
    TYPESAFE_EVALUATION_POLL_MS: "50",
  });
});
afterAll(async () => {
  await service?.stop();
  await fake?.close();
  await database?.close();
});

async function signIn(accountId: string, role: Role): Promise<{ client: AccountClient; cookie: string }> {
  const { token } = await inviteMember(database.db, accountId, uniqueEmail(role), service.clock.now(), role);
  const { client, jar } = accountClient(service.url);
  await client.acceptInvite({ inviteToken: token, password: PASSWORD });
  return { client, cookie: `typesafe_session=${jar.cookies.get("typesafe_session")}` };
}

const text = (value: string) => ({ kind: { case: "stringValue" as const, value } });
const bool = (value: boolean) => ({ kind: { case: "boolValue" as const, value } });

/** A finished evaluation of three labelled states on the question "=refund", and its owner's session. */
async function finishedEvaluation(): Promise<{ accountId: string; id: string; cookie: string }> {
  const { accountId } = await createTestAccount(database.db, { units: 5_000_000 });
  const { client, cookie } = await signIn(accountId, "owner");
  const { evaluation } = await client.createEvaluation({
    name: "refunds",
    questions: { "=refund": { type: "noul", instructions: "Does the customer want their money back?" } },
    examples: [
      { state: text("I want a refund for order 1"), labels: { "=refund": bool(true) } },
      { state: text("Where is my parcel?"), labels: { "=refund": bool(false) } },
      { state: text("=HYPERLINK(\"refund\")"), labels: { "=refund": bool(false) } },
    ],
    creditCapCredits: 1,
  });
  const id = evaluation!.id;
  await waitFor(async () => (await client.getEvaluation({ evaluationId: id })).evaluation!.state === "finished", "the evaluation to finish", 30_000);
  return { accountId, id, cookie };
}

const get = (query: string, headers: Record<string, string>) => fetch(`${service.url}${PATH}${query}`, { headers });

describe("GET /account/v1/evaluations/results.csv", () => {
  it("is the CLI's results CSV, byte for byte, as a private attachment, with the formula guard", async () => {
    const { id, cookie } = await finishedEvaluation();
    const response = await get(`?evaluation_id=${id}`, { cookie });
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toBe("text/csv; charset=utf-8; header=present");
    expect(response.headers.get("content-disposition")).toBe(`attachment; filename="evaluation-${id}.csv"`);
    expect(response.headers.get("cache-control")).toBe("no-store");
    expect(response.headers.get("x-content-type-options")).toBe("nosniff");
    const body = await response.text();
    const lines = body.split("\r\n");
    expect(lines[0]).toBe("question,type,labelled,answered,accuracy,brier,log_loss,ece,auroc,macro_f1,mae_steps,model,upstream,prompt_version");
    // 0.8 on the refund (right), 0.3 on the parcel (right), 0.8 on the "refund" formula labelled false (wrong): 2 of 3.
    // The key "=refund" would be a formula in a spreadsheet: quoted with a leading apostrophe, as usage.csv does.
    expect(lines[1]!.startsWith(`"'=refund",noul,3,3,0.6666666666666666,`)).toBe(true);
    expect(lines.slice(2)).toEqual([""]);

    const cli = await runAdmin(["evals", "results", "--evaluation", id, "--csv"], { DATABASE_URL: database.url });
    expect([cli.code, cli.stderr]).toEqual([0, ""]);
    expect(cli.stdout).toBe(body);
  }, 120_000);

  it("answers another account's evaluation exactly as one that does not exist, and a malformed or missing id naming evaluation_id", async () => {
    const mine = await finishedEvaluation();
    const { accountId: otherAccount } = await createTestAccount(database.db, { units: 1_000 });
    const other = await signIn(otherAccount, "owner");
    const answers = await Promise.all(
      [mine.id, crypto.randomUUID(), "not-a-uuid"].map(async (id) => {
        const response = await get(`?evaluation_id=${id}`, { cookie: other.cookie });
        const { data: { request_id: _requestId, ...data }, ...envelope } = (await response.json()) as { data: Record<string, unknown> };
        return [response.status, response.headers.get("content-disposition"), { ...envelope, data }];
      }),
    );
    for (const answer of answers) expect(answer).toEqual([404, null, { code: 40401, message: "no such evaluation", data: { reason: "NOT_FOUND", field: "evaluation_id" } }]);
    const missing = await get("", { cookie: other.cookie });
    expect([missing.status, ((await missing.json()) as { data: { reason: string; field: string; rule: string } }).data]).toMatchObject([400, { reason: "INVALID_ARGUMENT", field: "evaluation_id", rule: "required" }]);
  }, 120_000);

  it("lets a viewer read it (reading is every role's), and keeps the door's rules: session, origin, GET", async () => {
    const { accountId, id, cookie } = await finishedEvaluation();
    const owner = await (await get(`?evaluation_id=${id}`, { cookie })).text();
    const viewer = await signIn(accountId, "viewer");
    const read = await get(`?evaluation_id=${id}`, { cookie: viewer.cookie });
    expect(read.status).toBe(200);
    expect(await read.text()).toBe(owner);

    const signedOut = await get(`?evaluation_id=${id}`, {});
    expect([signedOut.status, await signedOut.json()]).toMatchObject([401, { data: { reason: "SIGNED_OUT" } }]);
    const crossSite = await get(`?evaluation_id=${id}`, { cookie, "sec-fetch-site": "cross-site" });
    expect([crossSite.status, await crossSite.json()]).toMatchObject([403, { data: { reason: "CROSS_SITE_REFUSED", field: "origin" } }]);
    const posted = await fetch(`${service.url}${PATH}?evaluation_id=${id}`, { method: "POST", headers: { cookie } });
    expect([posted.status, posted.headers.get("allow")]).toEqual([405, "GET"]);

    // An account that requires two-factor sign-in refuses a member without a second factor, as on every account-area surface.
    await database.db("account_settings").insert({ account_id: accountId, require_two_factor: true }).onConflict("account_id").merge();
    const refused = await get(`?evaluation_id=${id}`, { cookie: viewer.cookie });
    expect([refused.status, await refused.json()]).toMatchObject([403, { data: { reason: "TWO_FACTOR_REQUIRED" } }]);
  }, 120_000);
});
