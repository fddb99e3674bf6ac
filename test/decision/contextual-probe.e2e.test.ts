import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { balanceUnits, createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { assertInvariants } from "../support/invariants.js";
import { deferred, isProbe, logprobsReply, PROBE_OK, startFakeLlm, userContent, type FakeLlm, type FakeReply, type ReceivedRequest } from "../support/fake-llm.js";
import { waitFor } from "../support/wait.js";

/**
 * Contextual calibration's content-free probe under concurrency, on the real
 * service (in-process, port 0), PostgreSQL and the fake OpenAI-compatible
 * upstream: two first calls of one new signature at once ask the probe once,
 * and only the call that asked it pays; a call that waited for a probe that
 * never came asks it itself, and neither caller pays for the other.
 */

let database: TestDatabase;
let fake: FakeLlm;
let service: TestApp;
const MODEL = "typesafe/service-1.13";
const UNITS = 1_000_000;
const QUESTION_TOKENS = 120;
const PROBE_TOKENS = 50;

beforeAll(async () => {
  database = await createTestDatabase();
  fake = await startFakeLlm();
  service = await startTestApp(database, { TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_LLM_MAX_RETRIES: "0" });
});
afterAll(async () => {
  await service?.stop();
  await fake?.close();
  await database?.close();
});

/** A request about one of the two content-free states the service probes with ("N/A" and the empty state). */
function isContentFree(request: ReceivedRequest): boolean {
  return /<state>\n(N\/A)?\n<\/state>/.test(userContent(request));
}

/**
 * The fake for one test: a question about a caller's ticket gets yes 0.3 at
 * once; a content-free one gets yes 0.7 (the model's lean) when `contentFree`
 * lets it. `arrived` resolves when the content-free requests reach `count`
 * and when a caller's question with `marker` reaches the upstream.
 */
function script(contentFree: (n: number) => Partial<FakeReply>) {
  let contentFreeSeen = 0;
  const contentFreeWaiters: Array<{ count: number; resolve: () => void }> = [];
  const questionWaiters = new Map<string, () => void>();
  fake.setHandler((request) => {
    if (isProbe(request.body)) return PROBE_OK;
    if (isContentFree(request)) {
      contentFreeSeen++;
      for (const w of contentFreeWaiters.filter((w) => contentFreeSeen >= w.count)) w.resolve();
      return { ...logprobsReply({ yes: 0.7, no: 0.3 }, { prompt: PROBE_TOKENS }), ...contentFree(contentFreeSeen) };
    }
    for (const [marker, resolve] of questionWaiters) if (userContent(request).includes(marker)) resolve();
    return logprobsReply({ yes: 0.3, no: 0.7 }, { prompt: QUESTION_TOKENS });
  });
  return {
    contentFreeRequests: (count: number) => {
      const reached = deferred();
      contentFreeWaiters.push({ count, resolve: reached.resolve });
      if (contentFreeSeen >= count) reached.resolve();
      return reached.promise;
    },
    question: (marker: string) => {
      const reached = deferred();
      questionWaiters.set(marker, reached.resolve);
      return reached.promise;
    },
    contentFreeCount: () => contentFreeSeen,
  };
}

function decision(instructions: string, ticket: string) {
  return { model: MODEL, state: `ticket ${ticket}: the invoice is wrong`, questions: { urgent: { type: "noul", instructions, calibration: "contextual" } } };
}

type Answer = { noul: number; x_calibrated?: { method: string; noul: number; probe_usage?: Record<string, number> } };
const answerOf = (body: { data: Record<string, unknown> }) => (body.data["answers"] as Record<string, Answer>)["urgent"]!;
const inputTokensOf = (body: { data: Record<string, unknown> }) => (body.data["usage"] as Record<string, number>)["input_tokens"];
/** The raw 0.3 divided by the probe's lean (0.7 : 0.3) and renormalised. */
const CALIBRATED = Math.round(((0.3 / 0.7) / (0.3 / 0.7 + 0.7 / 0.3)) * 1e6) / 1e6;

describe("two first calls of one new contextual signature at once", () => {
  it("ask the content-free probe once: the first asks and pays for it, the second waits for it and pays only its question", async () => {
    const release = deferred();
    const upstream = script(() => ({ hold: release.promise }));
    const instructions = "Is it urgent, asked twice at once?";
    const first = await createTestAccount(database.db, { units: UNITS });
    const second = await createTestAccount(database.db, { units: UNITS });

    const firstCall = postJson(`${service.url}/api/v1/decisions`, decision(instructions, "A"), { apiKey: first.apiKey });
    await upstream.contentFreeRequests(2);
    // The second call joins the probe before its own question leaves, so its question reaching the upstream means it waits.
    const secondAsked = upstream.question("ticket B");
    const secondCall = postJson(`${service.url}/api/v1/decisions`, decision(instructions, "B"), { apiKey: second.apiKey });
    await secondAsked;
    release.resolve();
    const [a, b] = await Promise.all([firstCall, secondCall]);

    expect([a.status, b.status]).toEqual([200, 200]);
    expect(upstream.contentFreeCount()).toBe(2);
    expect(answerOf(a.body).x_calibrated).toEqual({ calibration_id: "", method: "contextual", noul: CALIBRATED, probe_usage: expect.objectContaining({ input_tokens: 2 * PROBE_TOKENS, upstream_calls: 2 }) });
    expect(answerOf(b.body).x_calibrated).toEqual({ calibration_id: "", method: "contextual", noul: CALIBRATED });
    expect([inputTokensOf(a.body), inputTokensOf(b.body)]).toEqual([QUESTION_TOKENS + 2 * PROBE_TOKENS, QUESTION_TOKENS]);
    expect(await balanceUnits(database.db, first.accountId)).toBe(UNITS - QUESTION_TOKENS - 2 * PROBE_TOKENS);
    expect(await balanceUnits(database.db, second.accountId)).toBe(UNITS - QUESTION_TOKENS);
    await assertInvariants(database.db, first.accountId);
    await assertInvariants(database.db, second.accountId);
  });

  it("when the first caller leaves before its probe is answered, the second asks the probe itself and pays for it; the first pays nothing", async () => {
    const never = deferred();
    // The first two content-free requests (the leaving call's) are held for good; any later one is answered at once.
    const upstream = script((n) => (n <= 2 ? { hold: never.promise } : {}));
    const instructions = "Is it urgent, for a caller who leaves?";
    const leaving = await createTestAccount(database.db, { units: UNITS });
    const staying = await createTestAccount(database.db, { units: UNITS });
    const caller = new AbortController();

    const leavingCall = postJson(`${service.url}/api/v1/decisions`, decision(instructions, "A"), { apiKey: leaving.apiKey, signal: caller.signal }).catch((err: unknown) => err);
    await upstream.contentFreeRequests(2);
    const stayingAsked = upstream.question("ticket B");
    const stayingCall = postJson(`${service.url}/api/v1/decisions`, decision(instructions, "B"), { apiKey: staying.apiKey });
    await stayingAsked;
    caller.abort();
    expect(await leavingCall).toBeInstanceOf(Error);
    const b = await stayingCall;

    expect(b.status).toBe(200);
    expect(upstream.contentFreeCount()).toBe(4);
    expect(answerOf(b.body).x_calibrated).toEqual({ calibration_id: "", method: "contextual", noul: CALIBRATED, probe_usage: expect.objectContaining({ input_tokens: 2 * PROBE_TOKENS, upstream_calls: 2 }) });
    expect(inputTokensOf(b.body)).toBe(QUESTION_TOKENS + 2 * PROBE_TOKENS);
    expect(await balanceUnits(database.db, staying.accountId)).toBe(UNITS - QUESTION_TOKENS - 2 * PROBE_TOKENS);
    await waitFor(async () => Number((await database.db("accounts").where({ id: leaving.accountId }).first("in_flight")).in_flight) === 0, "the leaving call's hold to be released");
    expect(await balanceUnits(database.db, leaving.accountId)).toBe(UNITS);
    await assertInvariants(database.db, leaving.accountId);
    await assertInvariants(database.db, staying.accountId);
    never.resolve();
  });

  it("a waiting caller that leaves is let go at once, nothing charged, while the first still gets its probe", async () => {
    const release = deferred();
    const upstream = script(() => ({ hold: release.promise }));
    const instructions = "Is it urgent, for a waiter who leaves?";
    const asking = await createTestAccount(database.db, { units: UNITS });
    const waiting = await createTestAccount(database.db, { units: UNITS });
    const caller = new AbortController();

    const askingCall = postJson(`${service.url}/api/v1/decisions`, decision(instructions, "A"), { apiKey: asking.apiKey });
    await upstream.contentFreeRequests(2);
    const waitingAsked = upstream.question("ticket B");
    const waitingCall = postJson(`${service.url}/api/v1/decisions`, decision(instructions, "B"), { apiKey: waiting.apiKey, signal: caller.signal }).catch((err: unknown) => err);
    await waitingAsked;
    caller.abort();
    expect(await waitingCall).toBeInstanceOf(Error);
    // Released while the probe it waited for is still held upstream.
    await waitFor(async () => Number((await database.db("accounts").where({ id: waiting.accountId }).first("in_flight")).in_flight) === 0, "the waiting call's hold to be released");
    expect(await balanceUnits(database.db, waiting.accountId)).toBe(UNITS);
    release.resolve();
    const a = await askingCall;

    expect(a.status).toBe(200);
    expect(upstream.contentFreeCount()).toBe(2);
    expect(answerOf(a.body).x_calibrated).toMatchObject({ method: "contextual", noul: CALIBRATED });
    expect(await balanceUnits(database.db, asking.accountId)).toBe(UNITS - QUESTION_TOKENS - 2 * PROBE_TOKENS);
    await assertInvariants(database.db, asking.accountId);
    await assertInvariants(database.db, waiting.accountId);
  });
});
