import { execFile } from "node:child_process";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { balanceUnits, createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { logprobsReply, routeByMarker, startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { startFakeSearch, type FakeSearch } from "../support/fake-search/providers.js";
import { assertInvariants } from "../support/invariants.js";

/**
 * The TypeScript and curl examples run as a reader would run them, as child
 * processes against the real service, so an example that stops working fails
 * `npm test`. The Python and Go examples need Debian packages and run in
 * `npm run test:polyglot` (test/polyglot).
 */
const execFileAsync = promisify(execFile);
const root = path.resolve(import.meta.dirname, "../..");

let database: TestDatabase;
let fakeLlm: FakeLlm;
let fakeSearch: FakeSearch;
let service: TestApp;

beforeAll(async () => {
  database = await createTestDatabase();
  fakeLlm = await startFakeLlm(
    routeByMarker({
      "asking for a refund": () => logprobsReply({ yes: 0.8, no: 0.2 }, { prompt: 1_000 }),
      "Which team": () => logprobsReply({ A: 0.9, B: 0.1 }, { prompt: 1_000 }),
    }),
  );
  // Hacker News is a default source and needs no key: a search with only q reaches it.
  fakeSearch = await startFakeSearch({ ids: ["hackernews"] });
  service = await startTestApp(database, {
    ...fakeSearch.env,
    TYPESAFE_LLM_BASE_URL: `${fakeLlm.url}/v1`,
    TYPESAFE_LLM_MODEL: "fake-model",
  });
});
afterAll(async () => {
  await service?.stop();
  await fakeSearch?.close();
  await fakeLlm?.close();
  await database?.close();
});

/** Runs an example with the service's address and a key, as its README says. */
async function runExample(command: string, args: string[], apiKey: string): Promise<string> {
  const { stdout } = await execFileAsync(command, args, {
    cwd: root,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, TYPESAFE_URL: service.url, TYPESAFE_KEY: apiKey },
    timeout: 60_000,
  });
  return stdout;
}

describe("examples/typescript: the generated Connect client over gRPC", () => {
  it("decides, searches with only q, and reads a refusal from its typed detail", async () => {
    const account = await createTestAccount(database.db, { units: 1_000_000 });
    const stdout = await runExample(process.execPath, ["--import", "tsx", "examples/typescript/client.ts"], account.apiKey);

    expect(JSON.parse(stdout)).toEqual({
      decision: { refund: 0.8, method: "logprobs", charged_credits: 0.001 },
      search: { sources: ["hackernews"], results: expect.any(Number), first_url: expect.stringMatching(/^https?:\/\//) },
      refused: { code: "InvalidArgument", reason: "INVALID_ARGUMENT", field: "model" },
    });
    // What the example was told agrees with the ledger: the decision's 1,000 tokens, and the search's source.
    expect(await balanceUnits(database.db, account.accountId)).toBeLessThan(1_000_000 - 1_000);
    await assertInvariants(database.db, account.accountId);
  });
});

describe("examples/typescript against a service without decisions", () => {
  it("prints the service's reason and message, not a stack trace, and exits 1", async () => {
    const bare = await startTestApp(database, fakeSearch.env);
    try {
      const account = await createTestAccount(database.db, { units: 1_000_000 });
      const run = execFileAsync(process.execPath, ["--import", "tsx", "examples/typescript/client.ts"], {
        cwd: root,
        env: { PATH: process.env.PATH, HOME: process.env.HOME, TYPESAFE_URL: bare.url, TYPESAFE_KEY: account.apiKey },
        timeout: 60_000,
      });
      const failed = (await run.then(
        () => undefined,
        (err: { code: number; stdout: string; stderr: string }) => err,
      ))!;
      expect(failed.code).toBe(1);
      expect(failed.stdout).toBe("");
      expect(failed.stderr.trim()).toMatch(/^typesafe refused the call: NOT_CONFIGURED: .*TYPESAFE_LLM_BASE_URL/);
      expect(failed.stderr).not.toMatch(/\n\s+at /);
    } finally {
      await bare.stop();
    }
  });
});

describe("examples/curl: the JSON gateway", () => {
  it("lists the sources, decides, searches, and gets a 400 that names its field", async () => {
    const account = await createTestAccount(database.db, { units: 1_000_000 });
    const stdout = await runExample("bash", ["examples/curl/call.sh"], account.apiKey);

    const lines = stdout.trim().split("\n").map((line) => {
      const [status, envelope] = line.split("\t");
      return { status: Number(status), body: JSON.parse(envelope!) };
    });
    expect(lines.map((line) => line.status)).toEqual([200, 200, 200, 400]);
    const [sources, decision, search, refused] = lines.map((line) => line.body);

    expect(sources.code).toBe(0);
    expect(sources.data.sources.map((source: { id: string }) => source.id)).toContain("hackernews");
    expect(decision.data.answers.refund).toMatchObject({ type: "noul", noul: 0.8 });
    expect(decision.data.answers.team).toMatchObject({ type: "choice", choice: "billing" });
    expect(decision.data.billing).toMatchObject({ funding: "paid", charged_credits: 0.002 });
    expect(search.data).toMatchObject({ q: "postgres vacuum", s: ["hackernews"], w: "any" });
    expect(refused).toMatchObject({ code: 40001, data: { reason: "INVALID_ARGUMENT", field: "w" } });
    await assertInvariants(database.db, account.accountId);
  });
});
