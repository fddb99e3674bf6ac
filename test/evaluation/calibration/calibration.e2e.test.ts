import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { applyCalibration, type CalibrationParams } from "../../../src/evaluation/calibration-apply.js";
import { PROMPT_VERSION } from "../../../src/decision/prompt.js";
import { createApiKey } from "../../../src/keys/store.js";
import { AnswerSchema, DecideRequestSchema, DecisionService } from "../../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { balanceUnits, createTestAccount, postJson } from "../../support/app.js";
import { createTestDatabase, type TestDatabase } from "../../support/database.js";
import { isProbe, logprobsReply, PROBE_OK, startFakeLlm, userContent, type FakeLlm } from "../../support/fake-llm.js";
import { waitFor } from "../../support/wait.js";
import { accountClient, inviteMember, refusal, startAccountApp, uniqueEmail, type AccountClient, type AccountTestApp } from "../../session-door/support.js";
import { seededRandom } from "../../../src/evaluation/seeded-random.js";

/**
 * A calibration end to end: the real service on port 0, PostgreSQL, and the
 * OpenAI-compatible fake upstream that distorts noul's true log-odds
 * (3 × true + 1) for a state that carries its true probability, as the
 * runner's end-to-end test does. An evaluation measures the distortion, a
 * Platt fit removes most of it on held-out answers, and a decision naming the
 * calibration answers raw and calibrated side by side.
 */

let database: TestDatabase;
let fake: FakeLlm;
let service: AccountTestApp;
const PASSWORD = "a long and unusual passphrase 42";
const MODEL = "typesafe/service-1.13";
const PROBE_TOKENS = 50;
/** The fake's lean on each content-free state; the means are yes 0.7 and A 0.8. */
const CONTENT_FREE_LEAN: Record<string, { yes: number; choiceA: number } | undefined> = { na: { yes: 0.8, choiceA: 0.85 }, empty: { yes: 0.6, choiceA: 0.75 } };

const logit = (p: number) => Math.log(p / (1 - p));
const sigmoid = (x: number) => 1 / (1 + Math.exp(-x));
const round6 = (x: number) => Math.round(x * 1e6) / 1e6;

beforeAll(async () => {
  database = await createTestDatabase(10, { runsEvaluations: true });
  fake = await startFakeLlm((request) => {
    if (isProbe(request.body)) return PROBE_OK;
    // Contextual calibration's content-free states: a model that leans to "yes" (or A) when nothing favours it, by a
    // different amount on each state, so only their arithmetic mean (yes 0.7, A 0.8) gives the values asserted below.
    const contentFree = CONTENT_FREE_LEAN[userContent(request).includes("<state>\nN/A\n</state>") ? "na" : userContent(request).includes("<state>\n\n</state>") ? "empty" : "none"];
    if (contentFree) {
      return userContent(request).includes("Which team")
        ? logprobsReply({ A: contentFree.choiceA, B: 1 - contentFree.choiceA }, { prompt: PROBE_TOKENS })
        : logprobsReply({ yes: contentFree.yes, no: 1 - contentFree.yes }, { prompt: PROBE_TOKENS });
    }
    // A choice with a constant lean: option A's true share t is read as 4t : (1 − t), as if the model favoured A fourfold whatever the state.
    const share = /billing share (0\.\d+)/.exec(userContent(request));
    if (share) {
      const t = Number(share[1]);
      return logprobsReply({ A: (4 * t) / (3 * t + 1), B: (1 - t) / (3 * t + 1) }, { prompt: 120 });
    }
    const match = /true probability (0\.\d+)/.exec(userContent(request));
    if (!match) return { status: 400, text: "no route" };
    const q = sigmoid(3 * logit(Number(match[1])) + 1);
    return logprobsReply({ yes: q, no: 1 - q }, { prompt: 120 });
  });
  service = await startAccountApp(database, {
    TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
    TYPESAFE_LLM_MODEL: "fake-model",
    TYPESAFE_EVALUATION_EXAMPLES_IN_FLIGHT: "8",
    TYPESAFE_EVALUATION_POLL_MS: "50",
  });
});
afterAll(async () => {
  await service?.stop();
  await fake?.close();
  await database?.close();
});

async function owner(): Promise<{ accountId: string; apiKey: string; client: AccountClient; cookie: string }> {
  const { accountId, apiKey } = await createTestAccount(database.db, { units: 100_000_000 });
  const { token } = await inviteMember(database.db, accountId, uniqueEmail("owner"), service.clock.now(), "owner");
  const { client, jar } = accountClient(service.url);
  await client.acceptInvite({ inviteToken: token, password: PASSWORD });
  return { accountId, apiKey, client, cookie: `typesafe_session=${jar.cookies.get("typesafe_session")}` };
}

const QUESTION = { type: "noul", instructions: "Is it urgent?" };
/** Enough answers that the held-out ECE of a well calibrated reading is mostly signal, not the noise of 10 sparse bins. */
const EXAMPLES = 2000;

function labelledStates(count: number, seed: number) {
  const random = seededRandom(seed);
  return Array.from({ length: count }, (_, i) => {
    const p = 0.02 + 0.96 * random();
    return {
      state: { kind: { case: "stringValue" as const, value: `ticket ${i}: true probability ${p.toFixed(4)}` } },
      labels: { urgent: { kind: { case: "boolValue" as const, value: random() < p } } },
    };
  });
}

/** The labelled states as a JSON Lines file, uploaded through the account area's streamed route (the RPC's JSON body holds about 1,000). */
async function finishedEvaluation(client: AccountClient, cookie: string): Promise<string> {
  const lines = labelledStates(EXAMPLES, 42).map((e) => JSON.stringify({ state: e.state.kind.value, labels: { urgent: e.labels.urgent.kind.value } }));
  const form = new FormData();
  form.set("questions", JSON.stringify({ urgent: QUESTION }));
  form.set("credit_cap_credits", "50");
  form.set("examples_in_flight", "8");
  form.set("examples", new Blob([lines.join("\n")]), "states.jsonl");
  const response = await fetch(`${service.url}/account/v1/evaluations/upload`, { method: "POST", body: form, headers: { cookie } });
  expect(response.status).toBe(200);
  const { id } = ((await response.json()) as { data: { evaluation: { id: string } } }).data.evaluation;
  await waitFor(async () => (await client.getEvaluation({ evaluationId: id })).evaluation!.state === "finished", "the evaluation to finish", 540_000);
  return id;
}

function decision(questions: Record<string, unknown>, state = "ticket 7: true probability 0.3000") {
  return { model: MODEL, state, questions };
}

let shared: { accountId: string; apiKey: string; client: AccountClient; calibrationId: string; params: CalibrationParams } | undefined;
let sharing: Promise<NonNullable<typeof shared>> | undefined;

/** One evaluation and one Platt fit, shared by the tests below (made once, even when the first test fails). */
function fitted() {
  sharing ??= (async () => {
    const o = await owner();
    const evaluationId = await finishedEvaluation(o.client, o.cookie);
    const { calibration } = await o.client.fitCalibration({ evaluationId, questionKey: "urgent", method: "platt" });
    shared = { ...o, calibrationId: calibration!.id, params: calibration!.parameters as unknown as CalibrationParams };
    return shared;
  })();
  return sharing;
}

describe("fitting a calibration from a finished evaluation", () => {
  it("stores Platt parameters under the question's signature, with held-out ECE cut to a third or less and a lower Brier score", async () => {
    const { client, calibrationId } = await fitted();
    const { calibration } = await client.getCalibration({ calibrationId });
    expect(calibration!.method).toBe("platt");
    expect(calibration!.version).toBe(1);
    expect(calibration!.signature).toMatchObject({ type: "noul", instructions: "Is it urgent?", labels: [], promptVersion: PROMPT_VERSION, model: MODEL, upstream: "fake-model" });
    const { before, after } = calibration!.heldOut!;
    expect([before!.count, after!.count, calibration!.heldOut!.folds]).toEqual([EXAMPLES, EXAMPLES, 5]);
    expect(before!.ece!).toBeGreaterThan(0.1);
    expect(after!.ece!).toBeLessThanOrEqual(before!.ece! / 3);
    expect(after!.brier!).toBeLessThan(before!.brier!);
    // The fake's distortion is logit q = 3 logit p + 1, so the fit undoes it: slope near 1/3, intercept near -1/3.
    const params = calibration!.parameters as { slope: number; intercept: number };
    expect(params.slope).toBeGreaterThan(0.2);
    expect(params.slope).toBeLessThan(0.5);

    // A second fit is a new calibration, the next version of the same signature; the first is unchanged.
    const again = await client.fitCalibration({ evaluationId: calibration!.evaluationId, questionKey: "urgent", method: "isotonic" });
    expect([again.calibration!.version, again.calibration!.id === calibrationId]).toEqual([2, false]);
    expect((await client.getCalibration({ calibrationId })).calibration).toEqual(calibration);
    const listed = await client.listCalibrations({});
    expect(listed.calibrations.map((c) => c.id)).toEqual([again.calibration!.id, calibrationId]);
  }, 600_000);

  it("refuses a method of another question type and an unknown question key, naming the field", async () => {
    const { client } = await fitted();
    const { calibration } = await client.getCalibration({ calibrationId: shared!.calibrationId });
    const evaluationId = calibration!.evaluationId;
    const wrongMethod = await refusal(client.fitCalibration({ evaluationId, questionKey: "urgent", method: "temperature" }));
    expect([wrongMethod.reason, wrongMethod.field, wrongMethod.rule]).toEqual(["INVALID_ARGUMENT", "method", "for a noul question, one of platt, isotonic"]);
    const wrongKey = await refusal(client.fitCalibration({ evaluationId, questionKey: "nope", method: "platt" }));
    expect([wrongKey.reason, wrongKey.field]).toEqual(["INVALID_ARGUMENT", "question_key"]);
    // An evaluation measures raw answers: a question naming a calibration is refused.
    const named = await refusal(
      client.createEvaluation({ questions: { urgent: { ...QUESTION, calibration: shared!.calibrationId } }, examples: labelledStates(1, 1), creditCapCredits: 1 }),
    );
    expect([named.reason, named.field]).toEqual(["INVALID_ARGUMENT", "questions.urgent.calibration"]);
  }, 120_000);
});

describe("a decision naming a calibration", () => {
  it("answers the raw values and the calibrated ones side by side, calibrated = the pure apply of the raw", async () => {
    const { apiKey, calibrationId, params } = await fitted();
    const res = await postJson(`${service.url}/api/v1/decisions`, decision({ urgent: { ...QUESTION, calibration: calibrationId } }), { apiKey });
    expect(res.status).toBe(200);
    const answer = (res.body.data["answers"] as Record<string, Record<string, unknown>>)["urgent"]!;
    const raw = answer["noul"] as number;
    expect(raw).toBeCloseTo(sigmoid(3 * logit(0.3) + 1), 6);
    const calibrated = answer["x_calibrated"] as Record<string, unknown>;
    expect(calibrated).toEqual({ calibration_id: calibrationId, method: "platt", noul: round6(applyCalibration(params, [raw, 1 - raw])[0]!) });
    // The distortion pushed 0.3 down to about 0.13; calibrated, it comes back near 0.3.
    expect(Math.abs((calibrated["noul"] as number) - 0.3)).toBeLessThan(Math.abs(raw - 0.3));
  }, 120_000);

  it("without a calibration, the answer is byte for byte the one it was, on JSON and on gRPC", async () => {
    const { apiKey, calibrationId } = await fitted();
    const plain = await postJson(`${service.url}/api/v1/decisions`, decision({ urgent: QUESTION }), { apiKey });
    const withIt = await postJson(`${service.url}/api/v1/decisions`, decision({ urgent: { ...QUESTION, calibration: calibrationId } }), { apiKey });
    const plainAnswer = (plain.body.data["answers"] as Record<string, unknown>)["urgent"];
    const { x_calibrated: _, ...rawOfCalibrated } = (withIt.body.data["answers"] as Record<string, Record<string, unknown>>)["urgent"]!;
    expect(JSON.stringify(plainAnswer)).toBe(JSON.stringify(rawOfCalibrated));
    expect(JSON.stringify(plain.body.data)).not.toContain("calibrat");

    const grpc = createClient(DecisionService, createGrpcTransport({ baseUrl: service.url }));
    const headers = { authorization: `Bearer ${apiKey}` };
    const request = (calibration: string) =>
      create(DecideRequestSchema, {
        model: MODEL,
        state: { kind: { case: "stringValue", value: "ticket 7: true probability 0.3000" } },
        questions: { urgent: { ...QUESTION, calibration } },
      });
    const a = (await grpc.decide(request(""), { headers })).answers["urgent"]!;
    const b = (await grpc.decide(request(calibrationId), { headers })).answers["urgent"]!;
    expect(b.xCalibrated?.calibrationId).toBe(calibrationId);
    const bRaw = fromBinary(AnswerSchema, toBinary(AnswerSchema, b));
    bRaw.xCalibrated = undefined;
    expect(Buffer.from(toBinary(AnswerSchema, a)).equals(Buffer.from(toBinary(AnswerSchema, bRaw)))).toBe(true);
  }, 120_000);

  it("a question whose signature differs is a 400 naming questions.<key>.calibration, on JSON and Connect, before any money moves", async () => {
    const { accountId, apiKey, calibrationId } = await fitted();
    const before = await balanceUnits(database.db, accountId);
    const asked = fake.questionRequests().length;
    const cases = [
      [{ type: "noul", instructions: "Is it on fire?", calibration: calibrationId }, "instructions"],
      [{ type: "choice", instructions: "Is it urgent?", criteria: { yes: null, no: null }, calibration: calibrationId }, "type (the calibration is for noul)"],
    ] as const;
    for (const [question, differs] of cases) {
      const res = await postJson(`${service.url}/api/v1/decisions`, decision({ urgent: question }), { apiKey });
      expect(res.status).toBe(400);
      expect(res.body.data).toMatchObject({ reason: "INVALID_ARGUMENT", field: "questions.urgent.calibration" });
      expect(res.body.message).toBe(`questions.urgent.calibration: the question's ${differs} differs from the calibration's`);
    }
    const connect = createClient(DecisionService, createConnectTransport({ baseUrl: service.url, httpVersion: "1.1" }));
    const refused = await refusal(
      connect.decide(
        create(DecideRequestSchema, {
          model: MODEL,
          state: { kind: { case: "stringValue", value: "x" } },
          questions: { urgent: { type: "noul", instructions: "Is it on fire?", calibration: calibrationId } },
        }),
        { headers: { authorization: `Bearer ${apiKey}` } },
      ),
    );
    expect([refused.code, refused.reason, refused.field]).toEqual([Code.InvalidArgument, "INVALID_ARGUMENT", "questions.urgent.calibration"]);
    expect(refused.detailMetadata).toEqual({ differs: "instructions", calibration_id: calibrationId });
    const malformed = await refusal(
      connect.decide(
        create(DecideRequestSchema, { model: MODEL, state: { kind: { case: "stringValue", value: "x" } }, questions: { urgent: { ...QUESTION, calibration: "v1" } } }),
        { headers: { authorization: `Bearer ${apiKey}` } },
      ),
    );
    expect([malformed.reason, malformed.field, malformed.rule]).toEqual(["INVALID_ARGUMENT", "questions.urgent.calibration", 'a calibration id (a UUID), "contextual", or absent']);
    expect(await balanceUnits(database.db, accountId)).toBe(before);
    expect(fake.questionRequests()).toHaveLength(asked);
  }, 120_000);

  it("another account's calibration is a 404 exactly like an id that does not exist, on decisions and on GetCalibration", async () => {
    const { calibrationId } = await fitted();
    const other = await owner();
    for (const id of [calibrationId, crypto.randomUUID()]) {
      const res = await postJson(`${service.url}/api/v1/decisions`, decision({ urgent: { ...QUESTION, calibration: id } }), { apiKey: other.apiKey });
      expect(res.status).toBe(404);
      expect(res.body.message).toBe("no such calibration");
      expect(res.body.data).toMatchObject({ reason: "NOT_FOUND", field: "questions.urgent.calibration" });
      const read = await refusal(other.client.getCalibration({ calibrationId: id }));
      expect([read.code, read.reason, read.message, read.field]).toEqual([Code.NotFound, "NOT_FOUND", "no such calibration", "calibration_id"]);
    }
    expect((await other.client.listCalibrations({})).calibrations).toEqual([]);
    expect(await balanceUnits(database.db, other.accountId)).toBe(100_000_000);
  }, 120_000);
});

describe("the key behind a calibrated decision", () => {
  it("is read once for the calibration's owner, yet a revoked key is refused at once, nothing charged", async () => {
    const { calibrationId, accountId } = await fitted();
    // A key of its own: the shared one stays live for the other tests.
    const { apiKey, keyId } = await createApiKey(database.db, accountId);
    const named = decision({ urgent: { ...QUESTION, calibration: calibrationId } });
    expect((await postJson(`${service.url}/api/v1/decisions`, named, { apiKey })).status).toBe(200);
    await database.db("api_keys").where({ id: keyId }).update({ revoked_at: new Date() });
    const balance = await balanceUnits(database.db, accountId);
    const refused = await postJson(`${service.url}/api/v1/decisions`, named, { apiKey });
    expect([refused.status, (refused.body.data as { reason: string }).reason]).toEqual([401, "UNAUTHENTICATED"]);
    expect(await balanceUnits(database.db, accountId)).toBe(balance);
  }, 120_000);
});

describe("contextual calibration", () => {
  it("probes both content-free states once per signature, in the call that needs it and paid by it, and divides by their mean", async () => {
    const { accountId, apiKey } = await owner();
    const question = { type: "noul", instructions: "Is it urgent, in context?", calibration: "contextual" };
    const q = sigmoid(3 * logit(0.3) + 1);
    // The mean of the two probes: yes (0.8 + 0.6) / 2 = 0.7. "N/A" alone (0.8), the empty state alone (0.6), or any other mean gives another value.
    const expected = (raw: number) => round6((raw / 0.7) / (raw / 0.7 + (1 - raw) / 0.3));
    const asked = fake.questionRequests().length;
    const balance = await balanceUnits(database.db, accountId);

    const first = await postJson(`${service.url}/api/v1/decisions`, decision({ urgent: question }), { apiKey });
    expect(first.status).toBe(200);
    const probes = fake.questionRequests().slice(asked).map(userContent).filter((content) => !content.includes("ticket 7"));
    expect(probes.map((content) => /<state>\n(.*)\n<\/state>/.exec(content)![1]).sort()).toEqual(["", "N/A"]);
    expect(fake.questionRequests().length - asked).toBe(3);
    expect((first.body.data["usage"] as Record<string, number>)["input_tokens"]).toBe(120 + 2 * PROBE_TOKENS);
    const answer = (first.body.data["answers"] as Record<string, Record<string, unknown>>)["urgent"]!;
    expect(answer["noul"]).toBeCloseTo(q, 6);
    const { probe_usage: probeUsage, ...calibrated } = answer["x_calibrated"] as Record<string, unknown>;
    expect(calibrated).toEqual({ calibration_id: "", method: "contextual", noul: expected(answer["noul"] as number) });
    // What the probe cost is shown beside the calibrated answer, and is part of the call's usage and charge.
    expect(probeUsage).toMatchObject({ input_tokens: 2 * PROBE_TOKENS, upstream_calls: 2 });
    expect(await balanceUnits(database.db, accountId)).toBe(balance - 120 - 2 * PROBE_TOKENS);

    const second = await postJson(`${service.url}/api/v1/decisions`, decision({ urgent: question }), { apiKey });
    expect(fake.questionRequests().length - asked).toBe(4);
    expect((second.body.data["usage"] as Record<string, number>)["input_tokens"]).toBe(120);
    // Cached: the same calibrated value, and no probe cost in this call.
    expect((second.body.data["answers"] as Record<string, Record<string, unknown>>)["urgent"]!["x_calibrated"]).toEqual(calibrated);
    expect(await balanceUnits(database.db, accountId)).toBe(balance - 240 - 2 * PROBE_TOKENS);
  }, 120_000);

  it("removes most of a choice's constant label bias", async () => {
    const { apiKey } = await owner();
    const question = { type: "choice", instructions: "Which team handles it?", criteria: { billing: null, infra: null }, calibration: "contextual" };
    const asked = fake.questionRequests().length;
    const shares = [0.1, 0.3, 0.5, 0.7, 0.9];
    let rawBias = 0;
    let calibratedBias = 0;
    for (const t of shares) {
      const res = await postJson(`${service.url}/api/v1/decisions`, decision({ team: question }, `team case: billing share ${t.toFixed(4)}`), { apiKey });
      expect(res.status).toBe(200);
      const answer = (res.body.data["answers"] as Record<string, Record<string, unknown>>)["team"]!;
      const raw = (answer["probabilities"] as Record<string, number>)["billing"]!;
      const calibrated = answer["x_calibrated"] as { method: string; probabilities: Record<string, number>; choice: string };
      expect(raw).toBeCloseTo((4 * t) / (3 * t + 1), 5);
      expect(calibrated.method).toBe("contextual");
      expect(calibrated.probabilities["billing"]).toBeCloseTo(t, 5);
      // At 0.5 the two tie, and a tie goes to the first option.
      expect(calibrated.choice).toBe(t >= 0.5 ? "billing" : "infra");
      rawBias += (raw - t) / shares.length;
      calibratedBias += (calibrated.probabilities["billing"]! - t) / shares.length;
    }
    expect(rawBias).toBeGreaterThan(0.2);
    expect(Math.abs(calibratedBias)).toBeLessThan(rawBias / 10);
    // Five decisions and one probe of two content-free states.
    expect(fake.questionRequests().length - asked).toBe(shares.length + 2);
  }, 120_000);
});
