import { execFile } from "node:child_process";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { balanceUnits, createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { logprobsReply, routeByMarker, startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { startFakeSearch, type FakeSearch } from "../support/fake-search/providers.js";
import { assertInvariants } from "../support/invariants.js";

/**
 * The polyglot proof: the Python and Go examples (examples/python,
 * examples/go), their code generated from proto/ by each example's one
 * script with Debian's protoc and plugins, call the real service over binary
 * gRPC. `.ci/run` installs the packages; `npm run test:polyglot` runs this
 * file. Debian's python3-grpcio lives beside /usr/bin/python3, not in other
 * interpreters on PATH (TYPESAFE_PYTHON overrides); Debian's Go modules live
 * in /usr/share/gocode, built in GOPATH mode because nothing can be
 * downloaded here.
 */
const execFileAsync = promisify(execFile);
const root = path.resolve(import.meta.dirname, "../..");
const python = process.env.TYPESAFE_PYTHON ?? "/usr/bin/python3";

let database: TestDatabase;
let fakeLlm: FakeLlm;
let fakeSearch: FakeSearch;
let service: TestApp;
let scratch: string;

beforeAll(async () => {
  scratch = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-polyglot-"));
  database = await createTestDatabase();
  fakeLlm = await startFakeLlm(
    routeByMarker({
      "Is it urgent?": () => logprobsReply({ yes: 0.7, no: 0.3 }, { prompt: 1_000 }),
      "How big": () => logprobsReply({ "0": 0.1, "1": 0.2, "2": 0.7 }, { prompt: 1_000 }),
    }),
  );
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
  if (scratch) await fs.rm(scratch, { recursive: true, force: true });
});

describe("a Python service with a client generated from proto/", () => {
  it("calls Decide, Search and ListSources over gRPC and reads 400/401/402/429 from the status details alone", async () => {
    const paying = await createTestAccount(database.db, { units: 1_000_000 });
    const broke = await createTestAccount(database.db, { units: 0 });
    const limited = await createTestAccount(database.db, { units: 1_000_000 });

    const generated = path.join(scratch, "python");
    // The very script `npm run example:python` runs: generation, then client.py with the same interpreter.
    const { stdout } = await execFileAsync("bash", [path.join(root, "examples/python/run.sh"), generated], {
      env: {
        PATH: process.env.PATH,
        TYPESAFE_PYTHON: python,
        TYPESAFE_URL: service.url,
        TYPESAFE_KEY: paying.apiKey,
        TYPESAFE_BROKE_KEY: broke.apiKey,
        TYPESAFE_LIMITED_KEY: limited.apiKey,
      },
      timeout: 60_000,
    });
    const seen = JSON.parse(stdout);

    // Two questions at 1,000 input tokens each: 2,000 units, 0.002 credits.
    expect(seen.decide).toEqual({ urgent_type: "noul", urgent_noul: 0.7, impact_label: "high", charged_credits: 0.002, model: "typesafe/service-1.13" });
    expect(seen.search.results).toBeGreaterThan(0);
    expect(seen.search.first_url).toMatch(/^https?:\/\//);
    expect(seen.search.sources).toEqual({ hackernews: "ok" });
    expect(seen.sources).toContain("hackernews");

    expect(seen.invalid).toMatchObject({ code: "INVALID_ARGUMENT", status_code: 3, reason: "INVALID_ARGUMENT", field: "model", field_violations: ["model"] });
    expect(seen.unauthenticated).toMatchObject({ code: "UNAUTHENTICATED", status_code: 16, reason: "UNAUTHENTICATED" });
    expect(seen.insufficient).toMatchObject({ code: "FAILED_PRECONDITION", status_code: 9, reason: "INSUFFICIENT_BALANCE" });
    expect(seen.rate_limited).toMatchObject({ code: "RESOURCE_EXHAUSTED", status_code: 8, reason: "RATE_LIMITED" });
    expect(seen.rate_limited.retry_delay_seconds).toBeGreaterThan(0);
    expect(seen.rate_limited.retry_delay_seconds).toBeLessThanOrEqual(60);
    for (const error of [seen.invalid, seen.unauthenticated, seen.insufficient, seen.rate_limited]) {
      expect(error.request_id).toMatch(/^[0-9a-f-]{36}$/);
    }

    // What the Python client was told agrees with the ledger.
    const searchUnits = 1_000_000 - (await balanceUnits(database.db, paying.accountId)) - 2_000;
    expect(searchUnits).toBeGreaterThanOrEqual(0);
    expect(await balanceUnits(database.db, broke.accountId)).toBe(0);
    expect(await balanceUnits(database.db, limited.accountId)).toBe(1_000_000 - 60 * 2_000);
    for (const account of [paying, broke, limited]) await assertInvariants(database.db, account.accountId);
  });
});

describe("a Go service with a client generated from proto/", () => {
  it("calls ListSources and Decide over gRPC and reads a 400 from status.Details()", async () => {
    // Generated and built afresh each run; Go's content-keyed cache (gitignored, in the clone) spares recompiling Debian's gRPC.
    const built = await execFileAsync("bash", [path.join(root, "examples/go/build.sh"), path.join(scratch, "go")], {
      timeout: 180_000,
      env: { ...process.env, GOCACHE: path.join(root, "examples/go/.build/cache") },
    });
    const client = built.stdout.trim();
    const paying = await createTestAccount(database.db, { units: 1_000_000 });
    const { stdout } = await execFileAsync(client, [], {
      env: { TYPESAFE_URL: service.url, TYPESAFE_KEY: paying.apiKey },
      timeout: 60_000,
    });
    expect(JSON.parse(stdout)).toEqual({
      sources: expect.arrayContaining(["hackernews"]),
      urgent_noul: 0.7,
      invalid: { code: "InvalidArgument", reason: "INVALID_ARGUMENT", field: "model", field_violation: "model" },
    });
    // One question at 1,000 input tokens; the refused call charged nothing.
    expect(await balanceUnits(database.db, paying.accountId)).toBe(1_000_000 - 1_000);
    await assertInvariants(database.db, paying.accountId);
  });
});
