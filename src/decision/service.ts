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
import type { Logger } from "../logger.js";
import { decisionReserveUnits, type Meter } from "../metering/meter.js";
import { meteredRpc } from "../metering/metered-rpc.js";
import { authenticate, requireApiKey } from "../call/auth.js";
import { callPhasesOf } from "../call/call-phases.js";
import { createLlmClient, type LlmClient } from "../upstream/llm-client.js";
import { pathOf, throwIfInvalid } from "../validation.js";
import { notReadyMessage, retryAfterSeconds, type EmbeddedModelHost } from "../upstream/embedded-supervisor.js";
import { createDecisionEngine, firstCallMessages, type DecisionEngine, QUESTION_BUDGET_TOKENS, type QuestionSpec } from "./engine.js";
import { optionOrder } from "./labels.js";
import { estimateTokens, PROMPT_VERSION, renderState } from "./prompt.js";
import { SUPPORTED_MODEL, isQuestionType, unknownQuestionType, validateDecideRequest } from "./validate.js";

/** Ends the engine's own deadline this long before the metering timeout, so partial answers still leave. */
const DEADLINE_MARGIN_MS = 250;

export interface DecisionServiceDeps {
  db: Knex;
  meter: Meter;
  /** Without `baseUrl`, Decide uses `embedded` (503 MODEL_NOT_READY until its model is loaded), or answers 503 NOT_CONFIGURED when there is none; both after authenticating. */
  llm: LlmConfig;
  logger: Logger;
  /** Defaults to the OpenAI-compatible client built from `llm`. */
  llmClient?: LlmClient;
  /** The in-process model, used when `llm.baseUrl` is unset. */
  embedded?: EmbeddedModelHost;
  metrics?: Pick<Metrics, "recordLlmCall" | "recordDecision">;
}

/**
 * DecisionService for gRPC, Connect and the JSON gateway alike. The order of
 * the steps is the money rule: key shape, validation and the prompt-size
 * check run before anything is reserved; the engine runs inside the metering
 * wrapper, which settles the actual cost or releases the hold.
 */
export function createDecisionService(deps: DecisionServiceDeps): ServiceImpl<typeof DecisionService> {
  const { db, meter, llm, logger, metrics, embedded } = deps;
  const client = deps.llmClient ?? (llm.baseUrl !== undefined ? createLlmClient({ config: llm, logger, metrics }) : undefined);
  const httpEngine = client ? createDecisionEngine({ llm: client, logger }) : undefined;
  let embeddedEngine: { model: LlmClient; engine: DecisionEngine } | undefined;
  /** The engine over the upstream, or over the embedded model once it is loaded. */
  const currentEngine = (): DecisionEngine | undefined => {
    if (httpEngine || !embedded) return httpEngine;
    const model = embedded.model();
    if (!model) return undefined;
    if (embeddedEngine?.model !== model) embeddedEngine = { model, engine: createDecisionEngine({ llm: model, logger }) };
    return embeddedEngine.engine;
  };

  return {
    async decide(request, ctx: HandlerContext) {
      const apiKey = requireApiKey(ctx);
      throwIfInvalid(validateDecideRequest(request));
      const questions = questionSpecs(request);
      const stateBlock = renderState(request.state!);
      for (const q of questions) {
        const tokens = estimateTokens(firstCallMessages(stateBlock, q));
        if (tokens > QUESTION_BUDGET_TOKENS) {
          const field = pathOf("questions", q.key);
          throw apiError("INVALID_ARGUMENT", `${field}: its prompt (state included) is about ${tokens} tokens, above ${QUESTION_BUDGET_TOKENS}`, {
            field,
            rule: `prompt at most ${QUESTION_BUDGET_TOKENS} tokens`,
            metadata: { estimated_tokens: String(tokens), max_tokens: String(QUESTION_BUDGET_TOKENS) },
          });
        }
      }
      const engine = currentEngine();
      if (!engine && embedded) {
        await authenticate(db, apiKey);
        const status = embedded.status();
        throw apiError("MODEL_NOT_READY", notReadyMessage(status), {
          metadata: { model_state: status.state, retry_after_seconds: String(retryAfterSeconds(status)) },
        });
      }
      if (!engine) {
        await authenticate(db, apiKey);
        throw apiError("NOT_CONFIGURED", "decisions are not configured: no upstream LLM (TYPESAFE_LLM_BASE_URL)");
      }

      const { response, billing } = await meteredRpc(
        meter,
        ctx,
        {
          schema: DecideResponseSchema,
          endpoint: "decide",
          apiKey,
          reserveUnits: decisionReserveUnits(questions.length),
          timeoutMs: llm.requestTimeoutMs,
          fingerprint: () => toJsonString(DecideRequestSchema, request),
        },
        async (signal) => {
          const deadlineMs = Date.now() + Math.max(llm.requestTimeoutMs - DEADLINE_MARGIN_MS, llm.requestTimeoutMs / 2);
          const outcome = await engine.decide({ stateBlock, questions }, { signal, deadlineMs });
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
          return { response, chargeUnits: Math.min(outcome.usage.inputTokens, decisionReserveUnits(questions.length)) };
        },
      );
      response.billing = create(BillingSchema, billing);
      return response;
    },
  };
}

/** The validated request as engine input, options in the documented canonical order. */
function questionSpecs(request: DecideRequest): QuestionSpec[] {
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
