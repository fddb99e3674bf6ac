import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { runToExit } from "../support/process.js";
import { callGrpc } from "../support/wire.js";
import { accountCase, csvCase, sendAccount, sendCsv, sendUpload, signedInOwner, uploadCase } from "./account-cases.js";
import { binaryCase, comparableVerdicts, compressedCase, grpcCase, grpcOutcome, jsonCase, problemOf, sendBinary, sendCompressed, sendJson } from "./cases.js";

/**
 * Property-based fuzzing of every surface in `npm test`: seeded and bounded
 * (a fixed number of runs and a time cap), so it fails the same way twice.
 * `npm run fuzz -- --seconds 600` runs the same cases for longer.
 */
let database: TestDatabase;
let service: TestApp;
/** The same service with unary gRPC on Connect's handler only: the reference the short path must match. */
let reference: TestApp;
let apiKey: string;

beforeAll(async () => {
  database = await createTestDatabase(4);
  service = await startTestApp(database);
  reference = await startTestApp(database, { TYPESAFE_GRPC_SHORT_PATH: "off" });
  ({ apiKey } = await createTestAccount(database.db, { units: 1_000_000 }));
});
afterAll(async () => {
  await reference?.stop();
  await service?.stop();
  await database?.close();
});

const settings = { seed: 20261124, numRuns: 150, interruptAfterTimeLimit: 12_000 };
const sameVerdict = (verdicts: { reason?: string; field?: string }[]) => new Set(verdicts.map((v) => `${v.reason}|${v.field}`)).size === 1;

describe("fuzzing every surface", () => {
  it("mutated JSON: no 5xx of ours, a reason (and field) on every error, no leak, the same verdict on the gateway and Connect", async () => {
    await fc.assert(
      fc.asyncProperty(jsonCase, async ({ rpc, body }) => {
        const verdicts = await sendJson(service.url, apiKey, rpc, body);
        expect(verdicts.flatMap((v) => (v.problem ? [`${v.surface}: ${v.problem}`] : []))).toEqual([]);
        expect(sameVerdict(verdicts), JSON.stringify(verdicts)).toBe(true);
      }),
      settings,
    );
  });

  it("mutated binary protobuf: no 5xx of ours, the same verdict on Connect and gRPC", async () => {
    await fc.assert(
      fc.asyncProperty(binaryCase, async ({ rpc, bytes }) => {
        const verdicts = await sendBinary(service.url, apiKey, rpc, bytes);
        expect(verdicts.flatMap((v) => (v.problem ? [`${v.surface}: ${v.problem}`] : []))).toEqual([]);
        expect(sameVerdict(verdicts), JSON.stringify(verdicts)).toBe(true);
      }),
      settings,
    );
  });
});

describe("fuzzing compressed bodies", () => {
  it("gzip, br, an unknown encoding, bombs, damaged data, a flag without encoding: no 5xx of ours on gRPC, gRPC-Web and Connect, the same verdict on each", async () => {
    await fc.assert(
      fc.asyncProperty(compressedCase, async (c) => {
        const verdicts = await sendCompressed(service.url, apiKey, c);
        expect(verdicts.flatMap((v) => (v.problem ? [`${v.surface}: ${v.problem}`] : []))).toEqual([]);
        expect(new Set(comparableVerdicts(c, verdicts)).size, JSON.stringify(verdicts)).toBe(1);
      }),
      settings,
    );
  });
});

describe("fuzzing the account area", () => {
  it("every AccountService method (JSON path, Connect JSON, gRPC) and the usage CSV and the examples upload, with an owner's session: no 5xx of ours, a reason (and field) on every error, no leak", async () => {
    const { cookie } = await signedInOwner(service.url, database.db);
    await fc.assert(
      fc.asyncProperty(accountCase, csvCase, uploadCase, async (c, query, upload) => {
        const verdicts = [...(await sendAccount(service.url, cookie, c)), await sendCsv(service.url, cookie, query), await sendUpload(service.url, cookie, upload)];
        expect(verdicts.flatMap((v) => (v.problem ? [`${v.surface} ${c.method.name}: ${v.problem}`] : []))).toEqual([]);
      }),
      settings,
    );
  });
});

describe("the gRPC short path against Connect's handler", () => {
  it("every generated unary gRPC request gets the same status, reason and detail on both (encodings, flags, deadlines, cut frames, trailing bytes, two messages)", async () => {
    await fc.assert(
      fc.asyncProperty(grpcCase, async ({ rpc, frame, headers }) => {
        const short = await callGrpc(service.url, rpc, frame, { apiKey, raw: true, headers });
        const connect = await callGrpc(reference.url, rpc, frame, { apiKey, raw: true, headers });
        expect(grpcOutcome(short)).toBe(grpcOutcome(connect));
        expect(problemOf({ ...short, grpc: true, text: grpcOutcome(short) })).toBeUndefined();
      }),
      settings,
    );
  });
});

describe("npm run fuzz", () => {
  it("runs outside vitest (its helpers register no test hooks) and ends on its count line with exit 0", async () => {
    // On PostgreSQL the script gets this file's database; otherwise it opens an embedded store of its own, as a
    // newcomer's `npm run fuzz` does (not the run's shared store: there its second of requests would queue behind
    // the other test files' statements). A fresh store is initdb in WebAssembly and every migration: seconds.
    const env: Record<string, string> = database.isExternal ? { DATABASE_URL: database.url } : {};
    const run = await runToExit("test/fuzz/run.ts", ["--seconds", "1", "--seed", "3"], env);
    expect(run.stderr).toBe("");
    expect(run.stdout).toMatch(/\nfuzz: [1-9]\d* requests in 1 s · 0 broken rules · 0 disagreements\n$/);
    expect(run.code).toBe(0);
  }, 120_000);
});
