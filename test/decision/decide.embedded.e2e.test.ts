import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildMessages, noulBlock, renderState } from "../../src/decision/prompt.js";
import { fromJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { NOUL_LABELS } from "../../src/decision/labels.js";
import { balanceUnits, createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { openReference, type Reference } from "../support/embedded-reference.js";
import { assertInvariants } from "../support/invariants.js";
import { writeTinyGguf } from "../support/tiny-gguf.js";
import { waitFor } from "../support/wait.js";

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
      TYPESAFE_LLM_EMBEDDED: "on",
      TYPESAFE_LLM_MODEL_PATH: modelFile,
      TYPESAFE_LLM_CONTEXT_TOKENS: "2048",
      TYPESAFE_LLM_THREADS: "1",
      TYPESAFE_DATA_DIR: dir,
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
  beforeAll(async () => {
    // A loopback port nobody listens on: the connection is refused at once, as offline.
    const closed = http.createServer();
    await new Promise<void>((resolve) => closed.listen(0, "127.0.0.1", resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((resolve) => closed.close(resolve));
    service = await startTestApp(
      database,
      { TYPESAFE_LLM_EMBEDDED: "on", TYPESAFE_LLM_MODEL_URL: `http://127.0.0.1:${port}/model.gguf`, TYPESAFE_DATA_DIR: dir, TYPESAFE_LOG_LEVEL: "info" },
      { onLogLine: (line) => lines.push(line) },
    );
  });
  afterAll(() => service?.stop());

  it("stays up and ready, says why in one log line, and answers decisions 503 with Retry-After and what to set", async () => {
    await waitFor(async () => (await probe(service.url, "healthz")).body.data.decisions?.model_state === "failed", "the fetch to fail");
    expect(await probe(service.url, "readyz")).toEqual({ status: 200, body: expect.objectContaining({ data: { status: "ready", decisions: { engine: "embedded", model_state: "failed" } } }) });
    const errors = lines.map((l) => JSON.parse(l) as { level: string; msg: string; reason?: string }).filter((l) => l.level === "error" || l.level === "warn");
    expect(errors).toEqual([expect.objectContaining({ level: "error", msg: "embedded model unavailable; decisions answer 503 until it is fixed" })]);
    expect(errors[0]!.reason).toMatch(/ECONNREFUSED/);

    const { accountId, apiKey } = await createTestAccount(database.db, { units: 1_000 });
    const res = await postJson(`${service.url}/api/v1/decisions`, request, { apiKey });
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBe("300");
    expect(res.body.code).toBe(50303);
    expect(res.body.data.reason).toBe("MODEL_NOT_READY");
    expect(res.body.message).toBe(
      "the embedded model is unavailable: it could not be downloaded (no connection to its address); set TYPESAFE_LLM_MODEL_PATH to a local GGUF file or TYPESAFE_LLM_BASE_URL to an LLM server",
    );
    expect(await balanceUnits(database.db, accountId)).toBe(1_000);
  });

  it("refuses a bad key before saying anything about the model", async () => {
    const res = await postJson(`${service.url}/api/v1/decisions`, request, { apiKey: "ts_live_nope" });
    expect(res.status).toBe(401);
  });
});
