import type { Metrics } from "../metrics.js";
import { create, toJsonString } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { Knex } from "knex";
import type { LlmConfig } from "../config.js";
import { apiError } from "../errors.js";
import {
  BillingSchema,
  DecideRequestSchema,
  DecideResponseSchema,
  type DecideRequest,
  type DecisionService,
} from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { decisionReserveUnits, type Meter } from "../metering/meter.js";
import { meteredRpc } from "../metering/metered-rpc.js";
import { apiKeyHashText } from "../keys/api-keys.js";
import { authenticate, requireApiKey } from "../call/authentication.js";
import { callPhasesOf } from "../call/call-phases.js";
import { pathOf, throwIfInvalid } from "../validation.js";
import { notReadyMessage, retryAfterSeconds } from "../upstream/embedded-supervisor.js";
import { planDecision, type EmbeddedDeadline } from "./embedded-deadline.js";
import type { DecisionEngines } from "./engine-choice.js";
import { firstCallMessages, QUESTION_BUDGET_TOKENS, type QuestionSpec, type UsageTotals } from "./engine.js";
import {
  CONTENT_FREE_STATES,
  CONTEXTUAL,
  addUsage,
  askContentFree,
  calibratedAnswer,
  calibrationsOf,
  createCalibrationCache,
  createProbeCache,
  type CalibrationCache,
  type ProbeCache,
} from "./calibration.js";
import { signatureDigest, signatureOf } from "../evaluation/calibration-signature.js";
import { optionOrder } from "./labels.js";
import { estimateTokens, PROMPT_VERSION, renderState } from "./prompt.js";
import { SUPPORTED_MODEL, isQuestionType, unknownQuestionType, validateDecideRequest } from "./validate.js";

/** Ends the engine's own deadline this long before the metering timeout, so partial answers still leave. */
const DEADLINE_MARGIN_MS = 250;

/** When the engine stops asking, for a call given `timeoutMs`: a margin before it, so partial answers still leave. */
export function engineDeadlineMs(timeoutMs: number): number {
  return Date.now() + Math.max(timeoutMs - DEADLINE_MARGIN_MS, timeoutMs / 2);
}

export interface DecisionServiceDeps {
  db: Knex;
  meter: Meter;
  /** The deadlines of a decision, and the embedded model's sequences and longest wait. */
  llm: LlmConfig;
  metrics?: Pick<Metrics, "recordDecision">;
  /**
   * What decisions run on (engine-choice.ts): on the embedded model, 503
   * MODEL_NOT_READY until it is loaded; with none, 503 NOT_CONFIGURED; both
   * after authenticating.
   */
  engines: DecisionEngines;
  /** Calibrations read so far; a bounded one of its own when absent. */
  calibrations?: CalibrationCache;
  /** Contextual calibration's answers to the content-free state; a bounded one of its own when absent. */
  probes?: ProbeCache;
}

/** The first question whose prompt (state included) is above the question budget: a decision refuses it before anything is held. */
export function promptTooLong(stateBlock: string, questions: readonly QuestionSpec[]): { field: string; rule: string; message: string; tokens: number } | undefined {
  for (const q of questions) {
    const tokens = estimateTokens(firstCallMessages(stateBlock, q));
    if (tokens > QUESTION_BUDGET_TOKENS) {
      return {
        field: pathOf("questions", q.key),
        rule: `prompt at most ${QUESTION_BUDGET_TOKENS} tokens`,
        message: `its prompt (state included) is about ${tokens} tokens, above ${QUESTION_BUDGET_TOKENS}`,
        tokens,
      };
    }
  }
  return undefined;
}

/**
 * DecisionService for gRPC, Connect and the JSON gateway alike. The order of
 * the steps is the money rule: key shape, validation and the prompt-size
 * check run before anything is reserved; the engine runs inside the metering
 * wrapper, which settles the actual cost or releases the hold.
 */
export function createDecisionService(deps: DecisionServiceDeps): ServiceImpl<typeof DecisionService> {
  const { db, meter, llm, metrics, engines } = deps;
  const calibrationCache = deps.calibrations ?? createCalibrationCache();
  const probeCache = deps.probes ?? createProbeCache();

  /** The key's account for the calibration's ownership check: read once per key, then kept (an unknown or revoked key is never kept). */
  async function accountOfKey(apiKey: string): Promise<string> {
    const hash = apiKeyHashText(apiKey);
    const known = calibrationCache.accountOfKey(hash);
    if (known) return known;
    const accountId = await authenticate(db, apiKey);
    calibrationCache.putKey(hash, accountId);
    return accountId;
  }

  return {
    async decide(request, ctx: HandlerContext) {
      const apiKey = requireApiKey(ctx);
      throwIfInvalid(validateDecideRequest(request));
      const questions = questionSpecs(request);
      const stateBlock = renderState(request.state!);
      const tooLong = promptTooLong(stateBlock, questions);
      if (tooLong) {
        throw apiError("INVALID_ARGUMENT", `${tooLong.field}: ${tooLong.message}`, {
          field: tooLong.field,
          rule: tooLong.rule,
          metadata: { estimated_tokens: String(tooLong.tokens), max_tokens: String(QUESTION_BUDGET_TOKENS) },
        });
      }
      // Only a call that names a calibration reads one (and its key, for the account); the others are untouched.
      const asked = { promptVersion: PROMPT_VERSION, model: SUPPORTED_MODEL, upstream: engines.upstream };
      const wanted = questions.flatMap((spec) => {
        const calibrationId = request.questions[spec.key]!.calibration;
        return calibrationId === "" || calibrationId === CONTEXTUAL ? [] : [{ spec, calibrationId }];
      });
      const calibrations = wanted.length === 0 ? undefined : await calibrationsOf(db, calibrationCache, await accountOfKey(apiKey), wanted, asked);
      // Contextual calibration probes each signature once per process; the probe is part of the call that asks it, and paid by it.
      // A call that waits for another's probe reserves it too: it asks itself when that one ends without a probe.
      const contextual = questions
        .filter((spec) => request.questions[spec.key]!.calibration === CONTEXTUAL)
        .map((spec) => {
          const digest = signatureDigest(signatureOf(spec, asked));
          return { spec, digest, probe: probeCache.get(digest) };
        });
      const toProbe = contextual.filter((c, i) => !c.probe && contextual.findIndex((o) => o.digest === c.digest) === i);
      const probeQuestions = toProbe.length * CONTENT_FREE_STATES.length;
      const engine = engines.current();
      if (!engine && engines.kind === "embedded") {
        await authenticate(db, apiKey);
        const status = engines.host.status();
        const retryAfter = retryAfterSeconds(status);
        throw apiError("MODEL_NOT_READY", notReadyMessage(status), {
          metadata: { model_state: status.state, ...(retryAfter === undefined ? {} : { retry_after_seconds: String(retryAfter) }) },
        });
      }
      if (!engine) {
        await authenticate(db, apiKey);
        throw apiError("NOT_CONFIGURED", "decisions are not configured: no upstream LLM (TYPESAFE_LLM_BASE_URL)");
      }

      // On the embedded model, the deadline is what the call's tokens and those queued ahead need (embedded-deadline.ts).
      const plan = planDecision(engines, llm, stateBlock, questions, ctx.timeoutMs());
      if (!plan.run) {
        await authenticate(db, apiKey);
        throw modelBusy(plan.refusal, plan.ownTokens, plan.queuedTokens);
      }
      const timeoutMs = plan.timeoutMs;

      const { response, billing } = await meteredRpc(
        meter,
        ctx,
        {
          schema: DecideResponseSchema,
          endpoint: "decide",
          apiKey,
          reserveUnits: decisionReserveUnits(questions.length + probeQuestions),
          timeoutMs,
          fingerprint: () => toJsonString(DecideRequestSchema, request),
        },
        async (signal) => {
          const deadlineMs = engineDeadlineMs(timeoutMs);
          const [outcome, probed] = await Promise.all([
            engine.decide({ stateBlock, questions }, { signal, deadlineMs }),
            Promise.all(toProbe.map((c) => probeCache.probe(c.digest, () => askContentFree(engine, c.spec, { signal, deadlineMs }), { signal, deadlineMs }))),
          ]);
          // A probe this call asked shows its usage on the first question of its signature, and counts in the call's usage and charge.
          const probeUsage = new Map<string, UsageTotals>();
          const probedByDigest = new Map<string, number[] | undefined>();
          probed.forEach(({ probe, usage }, i) => {
            probedByDigest.set(toProbe[i]!.digest, probe);
            if (!usage) return;
            addUsage(outcome.usage, usage);
            probeUsage.set(toProbe[i]!.spec.key, usage);
          });
          callPhasesOf(ctx).details = {
            prompt_version: PROMPT_VERSION,
            questions: questions.length,
            answered: outcome.answered,
            input_tokens: outcome.usage.inputTokens,
            cached_input_tokens: outcome.usage.cachedInputTokens,
            upstream_calls: outcome.usage.upstreamCalls,
          };
          metrics?.recordDecision(
            { input: outcome.usage.inputTokens, cachedInput: outcome.usage.cachedInputTokens, output: outcome.usage.outputTokens },
            outcome.answers.map(([, answer]) => answer.xMethod ?? "error"),
          );
          if (outcome.answered === 0) {
            const first = outcome.answers[0]?.[1];
            throw apiError("UPSTREAM_FAILED", "the upstream LLM could not answer any question", {
              metadata: { questions: String(questions.length), first_error_code: first?.code ?? "" },
            });
          }
          const response = create(DecideResponseSchema, {
            model: SUPPORTED_MODEL,
            promptVersion: PROMPT_VERSION,
            answers: Object.fromEntries(outcome.answers),
            usage: outcome.usage,
          });
          if (calibrations) {
            for (const spec of questions) {
              const row = calibrations.get(spec.key);
              const answer = response.answers[spec.key];
              if (row && answer) answer.xCalibrated = calibratedAnswer(spec, answer, row);
            }
          }
          for (const { spec, digest, probe: kept } of contextual) {
            const probe = kept ?? probedByDigest.get(digest);
            const answer = response.answers[spec.key];
            if (probe && answer) answer.xCalibrated = calibratedAnswer(spec, answer, { id: "", parameters: { method: "contextual", probe } }, probeUsage.get(spec.key));
          }
          return { response, chargeUnits: Math.min(outcome.usage.inputTokens, decisionReserveUnits(questions.length + probeQuestions)) };
        },
      ).finally(() => plan.giveBack());
      response.billing = create(BillingSchema, billing);
      return response;
    },
  };
}

/** The refusal of a call the embedded model cannot finish in time: the estimate, the limit, and when to try again if waiting helps. */
function modelBusy(plan: Extract<EmbeddedDeadline, { run: false }>, ownTokens: number, queuedTokens: number) {
  const seconds = (ms: number) => String(Math.ceil(ms / 1000));
  const limit = plan.limitedBy === "caller_deadline" ? "the caller's deadline" : "the longest wait (TYPESAFE_LLM_EMBEDDED_MAX_WAIT_MS)";
  const advice = plan.retryAfterMs === undefined ? "ask fewer questions per call" : "retry later, or ask fewer questions per call";
  return apiError("MODEL_BUSY", `the embedded model would need about ${seconds(plan.estimateMs)} s for this call and the ${queuedTokens} tokens queued ahead, more than ${limit} of ${seconds(plan.limitMs)} s; nothing was charged; ${advice}`, {
    metadata: {
      estimated_seconds: seconds(plan.estimateMs),
      limit_seconds: seconds(plan.limitMs),
      limited_by: plan.limitedBy,
      call_tokens: String(ownTokens),
      queued_tokens: String(queuedTokens),
      ...(plan.retryAfterMs === undefined ? {} : { retry_after_seconds: seconds(plan.retryAfterMs) }),
    },
  });
}

/** The validated request as engine input, options in the documented canonical order. */
export function questionSpecs(request: DecideRequest): QuestionSpec[] {
  return Object.entries(request.questions).map(([key, q]): QuestionSpec => {
    const criteria = q.criteria?.kind;
    // Validation has refused every other type; one that slips past is a bug, never read as some other type.
    if (!isQuestionType(q.type)) throw new Error(`question ${key}: unknown type reached the engine`);
    switch (q.type) {
      case "noul":
        return { key, type: "noul", instructions: q.instructions };
      case "choice":
        return { key, type: "choice", instructions: q.instructions, options: optionOrder(criteria?.case === "structValue" ? Object.keys(criteria.value.fields) : []) };
      case "score": {
        const values = criteria?.case === "listValue" ? criteria.value.values : [];
        return { key, type: "score", instructions: q.instructions, labels: values.map((v) => (v.kind.case === "stringValue" ? v.kind.value : "")) };
      }
      default:
        return unknownQuestionType(q.type);
    }
  });
}
