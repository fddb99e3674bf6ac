import crypto from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildMessages, noulBlock, renderState } from "../../src/decision/prompt.js";
import { fromJson } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { DecideRequestSchema, DecisionService } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { ErrorDetailSchema } from "../../src/gen/typesafe/error/v1/error_pb.js";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { NOUL_LABELS } from "../../src/decision/labels.js";
import { balanceUnits, createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { openReference, type Reference } from "../support/embedded-reference.js";
import { assertInvariants } from "../support/invariants.js";
import { tinyModelSettings, writeTinyGguf } from "../support/tiny-gguf.js";
import { waitFor } from "../support/wait.js";
import { createManualClock } from "../support/manual-clock.js";
import { createModelPace } from "../../src/upstream/model-pace.js";

let database: TestDatabase;
let dir: string;
let modelFile: string;
let reference: Reference;

beforeAll(async () => {
  database = await createTestDatabase();
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-embedded-e2e-"));
  modelFile = writeTinyGguf(path.join(dir, "tiny.gguf"));
  reference = await openReference(modelFile);
});
afterAll(async () => {
  await reference?.close();
  await database?.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

const request = {
  model: "typesafe/service-1.13",
  state: { ticket: "I was charged twice for my pro plan" },
  questions: { urgent: { type: "noul", instructions: "Is it urgent?" } },
};

async function probe(url: string, which: "healthz" | "readyz") {
  const res = await fetch(`${url}/${which}`);
  return { status: res.status, body: (await res.json()) as { data: { status: string; decisions?: Record<string, unknown> } } };
}

describe("with no upstream URL and a local model file", () => {
  let service: TestApp;
  beforeAll(async () => {
    service = await startTestApp(database, {
      ...tinyModelSettings(modelFile, dir),
    });
  });
  afterAll(() => service?.stop());

  it("answers a decision from the model, metered with the model's own token count", async () => {
    await waitFor(async () => (await probe(service.url, "healthz")).body.data.decisions?.model_state === "ready", "the model to load", 30_000);
    expect((await probe(service.url, "readyz")).body.data).toEqual({ status: "ready", decisions: { engine: "embedded", model_state: "ready" } });
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const res = await postJson(`${service.url}/api/v1/decisions`, request, { apiKey });
    expect(res.status).toBe(200);
    const messages = buildMessages(renderState(fromJson(ValueSchema, request.state)), noulBlock("Is it urgent?").text);
    const [yes, no] = await reference.labelProbabilities(messages, NOUL_LABELS.spellings);
    const answer = (res.body.data.answers as Record<string, { noul: number; x_label_mass: number; x_method: string }>).urgent!;
    expect(answer.x_method).toBe("logprobs");
    expect(answer.noul).toBeCloseTo(yes! / (yes! + no!), 4);
    expect(answer.x_label_mass).toBeCloseTo(yes! + no!, 4);
    const inputTokens = reference.tokenizeChat(messages).length;
    expect(res.body.data.usage).toEqual({ input_tokens: inputTokens, output_tokens: 1, cached_input_tokens: 0, upstream_calls: 1 });
    expect(await balanceUnits(database.db, accountId)).toBe(1_000_000 - inputTokens);
    await assertInvariants(database.db, accountId);
  });
});

describe("with no upstream URL and no way to fetch the model (offline)", () => {
  let service: TestApp;
  const lines: string[] = [];
  const clock = createManualClock();
  let firstWaitMs: number;
  beforeAll(async () => {
    // A loopback port nobody listens on: the connection is refused at once, as offline.
    const closed = http.createServer();
    await new Promise<void>((resolve) => closed.listen(0, "127.0.0.1", resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((resolve) => closed.close(resolve));
    service = await startTestApp(
      database,
      { TYPESAFE_LLM_EMBEDDED: "on", TYPESAFE_LLM_MODEL_URL: `http://127.0.0.1:${port}/model.gguf`, TYPESAFE_DATA_DIR: dir, TYPESAFE_LOG_LEVEL: "info" },
      { onLogLine: (line) => lines.push(line), overrides: { modelClock: clock } },
    );
    firstWaitMs = await clock.nextSleep();
  });
  afterAll(() => service?.stop());

  it("stays up and ready, says why in one log line, and answers decisions 503 with Retry-After at the next try and what to set", async () => {
    // The first wait is drawn from the upper half of the first step.
    expect(firstWaitMs).toBeGreaterThanOrEqual(5_000);
    expect(firstWaitMs).toBeLessThanOrEqual(10_000);
    const nextTry = Math.ceil(firstWaitMs / 1000);
    expect(await probe(service.url, "readyz")).toEqual({
      status: 200,
      body: expect.objectContaining({ data: { status: "ready", decisions: { engine: "embedded", model_state: "failed", next_try_in_seconds: nextTry } } }),
    });
    const errors = lines.map((l) => JSON.parse(l) as { level: string; msg: string; reason?: string; next_try_in_s?: number }).filter((l) => l.level === "error" || l.level === "warn");
    expect(errors).toEqual([expect.objectContaining({ level: "error", msg: "embedded model download failed; decisions answer 503 until a later try succeeds", next_try_in_s: nextTry })]);
    expect(errors[0]!.reason).toMatch(/ECONNREFUSED/);

    const { accountId, apiKey } = await createTestAccount(database.db, { units: 1_000 });
    const res = await postJson(`${service.url}/api/v1/decisions`, request, { apiKey });
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBe(String(nextTry));
    expect(res.body.code).toBe(50303);
    expect(res.body.data.reason).toBe("MODEL_NOT_READY");
    expect(res.body.message).toBe(
      `the embedded model is unavailable: it could not be downloaded (no connection to its address); the next try is in ${nextTry} s, or set TYPESAFE_LLM_MODEL_PATH to a local GGUF file or TYPESAFE_LLM_BASE_URL to an LLM server`,
    );
    expect(await balanceUnits(database.db, accountId)).toBe(1_000);
  });

  it("refuses a bad key before saying anything about the model", async () => {
    const res = await postJson(`${service.url}/api/v1/decisions`, request, { apiKey: "ts_live_nope" });
    expect(res.status).toBe(401);
  });
});

/**
 * A host shaped like the Hugging Face Hub's resolve endpoint: a rate-limited
 * request gets 429 with the `RateLimit` and `RateLimit-Policy` fields
 * (huggingface.co/docs/hub/rate-limits; their values as recorded in
 * huggingface/huggingface_hub#3553, draft-ietf-httpapi-ratelimit-headers-09); a file
 * stored in LFS answers 302 to its file store with `X-Linked-Size` and
 * `X-Linked-ETag` ("Resolve a file" in the Hub's OpenAPI document), and the
 * store answers 200 with the bytes. `answers` says what each resolve request gets.
 */
async function startHubLike(file: Buffer, answers: Array<"rate-limited" | "reset" | "file">) {
  const resolves: string[] = [];
  const sha = crypto.createHash("sha256").update(file).digest("hex");
  const server = http.createServer((req, res) => {
    if (req.url!.startsWith("/store/")) {
      res.writeHead(200, { "content-length": String(file.length), "accept-ranges": "bytes", etag: `"${sha}"`, "content-type": "binary/octet-stream" });
      return void res.end(file);
    }
    const answer = answers[resolves.length] ?? "file";
    resolves.push(answer);
    if (answer === "rate-limited") {
      res.writeHead(429, { "content-type": "text/plain; charset=utf-8", ratelimit: '"resolvers";r=0;t=40', "ratelimit-policy": '"fixed window";"resolvers";q=3000;w=300' });
      return void res.end("Too Many Requests");
    }
    if (answer === "reset") return void req.socket.destroy();
    res.writeHead(302, { location: `/store/${sha}?X-Amz-Signature=abc`, "x-linked-size": String(file.length), "x-linked-etag": `"${sha}"`, "content-length": "0" });
    res.end();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/Qwen/Qwen2.5-0.5B-Instruct-GGUF/resolve/9217f5db/model.gguf`,
    sha,
    resolves,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

describe("a download that fails, then succeeds on a later try", () => {
  let service: TestApp;
  let hub: Awaited<ReturnType<typeof startHubLike>>;
  const clock = createManualClock();
  const dataDir = () => path.join(dir, "later");
  beforeAll(async () => {
    const bytes = fs.readFileSync(modelFile);
    hub = await startHubLike(bytes, ["rate-limited", "reset", "file"]);
    service = await startTestApp(
      database,
      { TYPESAFE_LLM_EMBEDDED: "on", TYPESAFE_LLM_MODEL_URL: hub.url, TYPESAFE_DATA_DIR: dataDir(), TYPESAFE_LLM_CONTEXT_TOKENS: "2048", TYPESAFE_LLM_THREADS: "1" },
      {
        overrides: { modelClock: clock },
        configure: (config) => Object.assign(config.llm.embedded, { modelBytes: bytes.length, modelSha256: hub.sha, modelFileName: "tiny.gguf" }),
      },
    );
  });
  afterAll(async () => {
    await service?.stop();
    await hub?.close();
  });

  it("waits as the Hub asked, then longer, says when the next try is, and serves decisions once the file arrives, without a restart", async () => {
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const decide = () => postJson(`${service.url}/api/v1/decisions`, request, { apiKey });

    // 429 with the Hub's reset in 40 s: the wait is the Hub's, longer than the first step.
    expect(await clock.nextSleep()).toBe(40_000);
    let res = await decide();
    expect([res.status, res.headers.get("retry-after"), res.body.message]).toEqual([503, "40", expect.stringContaining("its download failed; the next try is in 40 s")]);
    clock.advance(25_000);
    expect((await probe(service.url, "readyz")).body.data.decisions).toEqual({ engine: "embedded", model_state: "failed", next_try_in_seconds: 15 });
    expect((await decide()).headers.get("retry-after")).toBe("15");

    // The connection is cut: the second wait is drawn from the upper half of twice the first step.
    clock.advance(15_000);
    const second = await clock.nextSleep();
    expect(second).toBeGreaterThanOrEqual(10_000);
    expect(second).toBeLessThanOrEqual(20_000);
    res = await decide();
    expect([res.status, res.headers.get("retry-after")]).toEqual([503, String(Math.ceil(second / 1000))]);
    expect(await balanceUnits(database.db, accountId)).toBe(1_000_000);

    // The third try redirects to the file store and brings the file: decisions work.
    clock.advance(second);
    await waitFor(async () => (await probe(service.url, "healthz")).body.data.decisions?.model_state === "ready", "the model to load", 30_000);
    expect(hub.resolves).toEqual(["rate-limited", "reset", "file"]);
    expect(fs.existsSync(path.join(dataDir(), "models", "tiny.gguf"))).toBe(true);
    res = await decide();
    expect(res.status).toBe(200);
    expect((res.body.data.answers as Record<string, { x_method: string }>).urgent!.x_method).toBe("logprobs");
    await assertInvariants(database.db, accountId);
  });
});

/** 40 questions, each with its own long instructions: on the tiny model, whose pieces are mostly single characters, about 10,000 prompt tokens. */
const fortyQuestions = {
  model: "typesafe/service-1.13",
  state: { ticket: "I was charged twice for my pro plan" },
  questions: Object.fromEntries(
    Array.from({ length: 40 }, (_, i) => [`q${i}`, { type: "noul", instructions: `Question ${i}: ${"is the customer asking for a refund of the second charge, and is it urgent? ".repeat(3)}` }]),
  ),
};

describe("a call whose tokens need longer than the configured deadline", () => {
  let service: TestApp;
  // The pace's clock moves only when the test moves it: the rate the test gives it is the rate each call is planned with.
  let paceNow = 0;
  const pace = createModelPace({ now: () => paceNow });
  beforeAll(async () => {
    service = await startTestApp(
      database,
      {
        ...tinyModelSettings(modelFile, dir),
        // Far shorter than 40 long questions take on any machine.
        TYPESAFE_LLM_REQUEST_TIMEOUT_MS: "100",
        TYPESAFE_LLM_EMBEDDED_MAX_WAIT_MS: "600000",
      },
      { overrides: { modelPace: pace } },
    );
    await waitFor(async () => (await probe(service.url, "healthz")).body.data.decisions?.model_state === "ready", "the model to load", 30_000);
  });
  afterAll(() => service?.stop());

  /** Gives the pace one measurement: `tokensPerSecond` over one busy second. */
  function measured(tokensPerSecond: number) {
    // What was measured before weighs nothing next to this one.
    for (let i = 0; i < 200; i++) pace.evaluating()(0);
    const ended = pace.evaluating();
    paceNow += 1_000;
    ended(tokensPerSecond);
  }

  it("runs to the end while the model makes progress, with every question answered and the whole prompt charged", async () => {
    // A rate slower than this machine's: the call is given about 50 s, far past the 100 ms deadline.
    measured(300);
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 10_000_000 });
    const started = performance.now();
    const res = await postJson(`${service.url}/api/v1/decisions`, fortyQuestions, { apiKey });
    const tookMs = performance.now() - started;
    expect(res.status).toBe(200);
    const answers = res.body.data.answers as Record<string, { type?: string; x_method?: string }>;
    expect(Object.values(answers).filter((a) => a.x_method !== "logprobs")).toEqual([]);
    expect(Object.keys(answers)).toHaveLength(40);
    // Without the longer deadline this call is cut at 100 ms: it must have needed more.
    expect(tookMs).toBeGreaterThan(100);
    const usage = res.body.data.usage as { input_tokens: number };
    expect(await balanceUnits(database.db, accountId)).toBe(10_000_000 - usage.input_tokens);
    expect(pace.queuedTokens()).toBe(0);
    await assertInvariants(database.db, accountId);
  });

  it("is refused at once, typed, with the estimate, when it cannot finish within the longest wait: nothing reserved or charged", async () => {
    measured(10);
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 10_000_000 });
    const res = await postJson(`${service.url}/api/v1/decisions`, fortyQuestions, { apiKey });
    expect(res.status).toBe(503);
    expect(res.body.code).toBe(50304);
    const data = res.body.data as { reason: string; metadata: Record<string, string> };
    expect(data.reason).toBe("MODEL_BUSY");
    expect(data.metadata).toMatchObject({ limit_seconds: "600", limited_by: "max_wait", queued_tokens: "0" });
    const callTokens = Number(data.metadata.call_tokens);
    expect(callTokens).toBeGreaterThan(8_000);
    expect(Number(data.metadata.estimated_seconds)).toBe(Math.ceil((callTokens / 10) * 1.5));
    // This call alone needs more than the limit: waiting does not help, so there is no Retry-After.
    expect(res.headers.get("retry-after")).toBeNull();
    expect(res.body.message).toMatch(/^the embedded model would need about \d+ s for this call and the 0 tokens queued ahead, more than the longest wait \(TYPESAFE_LLM_EMBEDDED_MAX_WAIT_MS\) of 600 s; nothing was charged; ask fewer questions per call$/);
    expect(await balanceUnits(database.db, accountId)).toBe(10_000_000);
    const rows = await database.db("requests").where({ account_id: accountId }).count({ n: "*" });
    expect(Number(rows[0]?.n)).toBe(0);
    expect(pace.queuedTokens()).toBe(0);
    await assertInvariants(database.db, accountId);
  });

  it("is refused at once when the caller's own deadline (grpc-timeout) is shorter than the estimate", async () => {
    measured(300);
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 10_000_000 });
    const client = createClient(DecisionService, createGrpcTransport({ baseUrl: service.url }));
    const err = await client
      .decide(fromJson(DecideRequestSchema, fortyQuestions), { headers: { authorization: `Bearer ${apiKey}` }, timeoutMs: 5_000 })
      .catch((e: unknown) => ConnectError.from(e));
    expect(err).toBeInstanceOf(ConnectError);
    expect((err as ConnectError).code).toBe(Code.Unavailable);
    const detail = (err as ConnectError).findDetails(ErrorDetailSchema)[0]!;
    expect(detail.reason).toBe("MODEL_BUSY");
    expect(detail.metadata).toMatchObject({ limited_by: "caller_deadline", limit_seconds: "5" });
    expect(await balanceUnits(database.db, accountId)).toBe(10_000_000);
  });

  it("a call that fits once the queue ahead drains is told when to retry", async () => {
    measured(300);
    const { apiKey } = await createTestAccount(database.db, { units: 10_000_000 });
    // Another caller's work, booked ahead: about 2,000 s of it at this rate.
    const ahead = pace.book(400_000);
    try {
      const res = await postJson(`${service.url}/api/v1/decisions`, request, { apiKey });
      expect(res.status).toBe(503);
      expect((res.body.data as { reason: string }).reason).toBe("MODEL_BUSY");
      expect(res.headers.get("retry-after")).toBe(String(Math.ceil((400_000 / 300) * 1.5)));
    } finally {
      ahead();
    }
  });
});
