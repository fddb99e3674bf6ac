import { execFile } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runAdmin } from "../support/process.js";
import { startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { logprobsReply, routeByMarker, startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { startFakeSearch, type FakeSearch } from "../support/fake-search/providers.js";

/**
 * The README's first steps, run as a reader runs them: the CLI's
 * `accounts create` (its printed shape), then the curl decision, copied out of
 * the README's own code blocks and pointed at a real service. The example
 * answers printed in the README must have the shape of what those commands
 * print: every field the README shows, with a value of the same kind, and the
 * same funding and answer types. The same commands in docs/decisions.md and
 * docs/operating.md run here too, and docs/account-area.md's first invite,
 * whose printed example must list every field the CLI prints.
 */
const root = path.resolve(import.meta.dirname, "../..");
const blocksOf = (page: string) =>
  [...fs.readFileSync(path.join(root, page), "utf8").matchAll(/```(\w+)\n([\s\S]*?)```/g)].map((m) => ({ lang: m[1]!, text: m[2]! }));
const blocks = blocksOf("README.md");
/** Runs a curl block of a page against the service, with the key in $KEY, and parses what it prints. */
async function runCurl(text: string, key: string): Promise<{ code: number; data: Record<string, any> }> {
  const { stdout } = await promisify(execFile)("bash", ["-c", text.replaceAll("localhost:8080", service.url)], { env: { PATH: process.env.PATH, KEY: key }, timeout: 30_000 });
  return JSON.parse(stdout);
}

/** The README's printed example, with its elisions (…) taken out, as JSON. */
function example(text: string): unknown {
  return JSON.parse(text.replace(/,\s*…/g, "").replace(/"[^"]*…"/g, '""').replace(/…/g, ""));
}

/** Each path of `shown` whose kind differs from the same path in `real`, or is missing there. */
function shapeDifferences(shown: unknown, real: unknown, at = "$"): string[] {
  if (shown === null || typeof shown !== "object") {
    const kind = (v: unknown) => (v === null ? "null" : Array.isArray(v) ? "array" : typeof v);
    return kind(shown) === kind(real) ? [] : [`${at}: README shows ${kind(shown)}, a run gives ${kind(real)}`];
  }
  if (real === null || typeof real !== "object") return [`${at}: missing in a run`];
  return Object.entries(shown).flatMap(([key, value]) =>
    key in real ? shapeDifferences(value, (real as Record<string, unknown>)[key], `${at}.${key}`) : [`${at}.${key}: missing in a run`],
  );
}

let database: TestDatabase;
let fake: FakeLlm;
let fakeSearch: FakeSearch;
let service: TestApp;
beforeAll(async () => {
  fakeSearch = await startFakeSearch({ ids: ["hackernews"] });
  database = await createTestDatabase();
  fake = await startFakeLlm(
    routeByMarker({
      "asking for a refund": () => logprobsReply({ yes: 0.85, no: 0.14 }, { prompt: 200 }),
      "Which team": () => logprobsReply({ A: 0.9, B: 0.06, C: 0.02 }, { prompt: 200 }),
      "How severe": () => logprobsReply({ "0": 0.05, "1": 0.25, "2": 0.6, "3": 0.1 }, { prompt: 200 }),
    }),
  );
  service = await startTestApp(database, { ...fakeSearch.env, TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_LLM_MODEL: "fake-model" });
});
afterAll(async () => {
  await service?.stop();
  await fake?.close();
  await fakeSearch?.close();
  await database?.close();
});

describe("README: the first key and the first decision, as written", () => {
  it("accounts create, then the curl decision, print what the README shows", async () => {
    const create = blocks.find((b) => b.lang === "sh" && b.text.includes("accounts create"))!;
    const [command, printed] = create.text.split("\n").filter((l) => l.trim() !== "");
    const args = command!.replace(/^npm run --silent admin -- /, "").trim().split(/\s+/);
    const created = await runAdmin(args, { DATABASE_URL: database.url });
    expect(created.code).toBe(0);
    const account = JSON.parse(created.stdout);
    expect(shapeDifferences(example(printed!.replace(/^# /, "")), account)).toEqual([]);

    // docs/operating.md shows the very same command.
    expect(blocksOf("docs/operating.md").some((b) => b.lang === "sh" && b.text.trim() === command!.trim())).toBe(true);

    const curl = blocks.find((b) => b.lang === "sh" && b.text.includes("/api/v1/decisions"))!;
    const answer = await runCurl(curl.text, account.api_key);
    const shown = example(blocks.find((b) => b.lang === "json" && b.text.includes('"answers"'))!.text) as typeof answer;
    expect(shapeDifferences(shown, answer)).toEqual([]);
    // What a reader following the README gets: a free request (it made the account with free requests), the same answer types.
    expect(answer.data.billing.funding).toBe(shown.data.billing.funding);
    for (const [key, value] of Object.entries(shown.data.answers as Record<string, { type: string }>)) expect(answer.data.answers[key].type).toBe(value.type);

    // docs/decisions.md's decision, and the README's search, answer too.
    const decisionsPage = blocksOf("docs/decisions.md").find((b) => b.lang === "sh" && b.text.includes("/api/v1/decisions"))!;
    const fromDecisionsPage = await runCurl(decisionsPage.text, account.api_key);
    expect(shapeDifferences(shown, fromDecisionsPage)).toEqual([]);
    const search = await runCurl(blocks.find((b) => b.lang === "sh" && b.text.includes("/api/v1/search"))!.text, account.api_key);
    expect(search).toMatchObject({ code: 0, data: { q: "postgres vacuum", w: "7d" } });
    expect(search.data.results).toEqual(expect.any(Array));
  });
});

describe("docs/account-area.md: inviting the first member, as written", () => {
  it("accounts create, then members invite with that account's id, print exactly the fields the page shows", async () => {
    const block = blocksOf("docs/account-area.md").find((b) => b.lang === "sh" && b.text.includes("members invite"))!;
    const lines = block.text.split("\n").filter((l) => l.trim() !== "");
    const [create, invite] = lines.filter((l) => l.startsWith("npm run"));
    const args = (command: string) => command.replace(/^npm run --silent admin -- /, "").trim().split(/\s+/);
    const created = await runAdmin(args(create!), { DATABASE_URL: database.url });
    expect(created.code).toBe(0);
    const invited = await runAdmin(args(invite!.replace("<account_id>", JSON.parse(created.stdout).account_id)), { DATABASE_URL: database.url });
    expect(invited.code).toBe(0);
    const real = JSON.parse(invited.stdout) as Record<string, unknown>;
    // The example elides values (…), never fields: it shows every field the command prints, in its order.
    const shown = example(lines.find((l) => l.startsWith("# {"))!.replace(/^# /, "")) as Record<string, unknown>;
    expect(Object.keys(shown)).toEqual(Object.keys(real));
    expect(shapeDifferences(shown, real)).toEqual([]);
    expect(real).toMatchObject({ email: shown["email"], role: shown["role"] });
    expect(String(real["invite_url"])).toMatch(/^http:\/\/127\.0\.0\.1:8080\/account\/\?invite=/);
  }, 90_000);
});

describe("README: the TypeScript snippet, run as the README says", () => {
  it("saved at the root of the repository and run with tsx, it prints the first result's URL", async () => {
    const account = JSON.parse((await runAdmin(["accounts", "create", "--credits", "5"], { DATABASE_URL: database.url })).stdout);
    const snippet = blocks.find((b) => b.lang === "ts" && b.text.includes("createClient"))!.text;
    // A name of its own at the root, where the README says to save it (its imports are relative to the root).
    const file = path.join(root, `.readme-snippet-${process.pid}.ts`);
    fs.writeFileSync(file, snippet.replaceAll("http://127.0.0.1:8080", service.url));
    try {
      const { stdout } = await promisify(execFile)(process.execPath, ["--import", "tsx", file], {
        cwd: root,
        env: { PATH: process.env.PATH, HOME: process.env.HOME, KEY: account.api_key },
        timeout: 60_000,
      });
      expect(stdout.trim()).toMatch(/^https?:\/\/\S+$/);
    } finally {
      fs.rmSync(file, { force: true });
    }
  });
});
