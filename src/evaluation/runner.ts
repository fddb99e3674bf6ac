import crypto from "node:crypto";
import { setMaxListeners } from "node:events";
import { create, fromJson, toJson, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import type { Knex } from "knex";
import { linkedSignal } from "../abort-signals.js";
import type { EvaluationConfig, LlmConfig } from "../config.js";
import { PROMPT_VERSION, renderState } from "../decision/prompt.js";
import type { DecisionEngine, QuestionSpec } from "../decision/engine.js";
import type { DecisionEngines } from "../decision/engine-choice.js";
import { planDecision } from "../decision/embedded-deadline.js";
import { engineDeadlineMs, questionSpecs } from "../decision/service.js";
import { AnswerSchema, DecideRequestSchema, type Question } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { QuestionSchema } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import type { Logger } from "../logger.js";
import { admitExampleHold } from "../metering/evaluation-holds.js";
import { decisionReserveUnits } from "../metering/meter.js";
import { claimExamples, extendExampleLease, finishExample, releaseOrphanedExamples, type ClaimedExample, type ExampleOutcome } from "./store.js";

/** Attempts of an example whose every question failed with a retryable error, before it counts as failed. */
export const MAX_EXAMPLE_ATTEMPTS = 3;

export interface EvaluationRunnerDeps {
  db: Knex;
  engines: DecisionEngines;
  config: EvaluationConfig;
  /** The configured deadline of a decision; an example on the embedded model gets longer when its queue needs it (DecisionEngines.plan). */
  requestTimeoutMs: number;
  /** The embedded model's limits, for the deadline a Decide call of the same questions gets (planDecision). */
  llm: Pick<LlmConfig, "requestTimeoutMs" | "embedded">;
  /** Added to the deadline to form an example's lease (the metering's lease margin). */
  leaseMarginMs: number;
  /** The account area's clock: the time of the activity line of an evaluation that stops or finishes. */
  now: () => Date;
  logger: Logger;
}

export interface EvaluationRunner {
  start(): void;
  /** Looks for work now (an evaluation was created or resumed). */
  wake(): void;
  /** Stops taking examples, ends those in flight (their holds released, the examples put back) and waits. */
  stop(): Promise<void>;
  /** Examples this replica is running now. */
  inFlight(): number;
}

/**
 * The fifth background worker, on a lease like the others: any replica takes
 * examples of running evaluations (store.claimExamples), runs each as a
 * metered decision outside the API's limits, and records the outcome and
 * settles its hold in one transaction, only while its lease holds. A replica
 * killed mid-example leaves the lease to run out; another takes the example
 * with its hold and settles that hold once. All of this replica's examples are
 * one party of the upstream's fair queue, so the API's calls always get their
 * turn; `examplesInFlight` bounds how many slots the evaluations take at once.
 */
export function createEvaluationRunner(deps: EvaluationRunnerDeps): EvaluationRunner {
  const { db, engines, config, logger } = deps;
  const leaseMs = deps.requestTimeoutMs + deps.leaseMarginMs;
  const party = {};
  const stopping = new AbortController();
  // Every example in flight listens for the stop.
  setMaxListeners(0, stopping.signal);
  const running = new Set<Promise<void>>();
  let wakeNow: (() => void) | undefined;
  /** Set by a wake that came while a tick ran: the loop looks again at once instead of waiting. */
  let woken = false;
  const wake = () => {
    woken = true;
    wakeNow?.();
  };
  let loop: Promise<void> | undefined;
  let ticks = 0;

  /** Runs one example; true when it ended (answered, failed or stopped), so that the next one may start at once. */
  async function runExample(claimed: ClaimedExample): Promise<boolean> {
    const log = logger.child({ evaluation_id: claimed.evaluationId, position: claimed.position });
    const outcome = await attempt(claimed).catch((err: unknown): ExampleOutcome => {
      log.warn("evaluation example failed", { err });
      return { kind: "retry", error: "internal" };
    });
    try {
      const recorded = await finishExample(db, claimed, outcome, deps.now());
      if (!recorded) log.warn("evaluation example lost its lease; another replica finishes it");
    } catch (err) {
      // The lease runs out and the example is taken again, with the same hold.
      log.warn("could not record an evaluation example", { err });
    }
    // An example put back (waiting for money, no engine yet) is looked at again at the next poll, not at once.
    return outcome.kind !== "retry";
  }

  async function attempt(claimed: ClaimedExample): Promise<ExampleOutcome> {
    const engine = engines.current();
    if (!engine) return { kind: "retry", error: "no_engine" };
    const questions = Object.fromEntries(Object.entries(claimed.questions).map(([k, q]) => [k, fromJson(QuestionSchema, q as JsonValue)])) as Record<string, Question>;
    const specs = questionSpecs(create(DecideRequestSchema, { questions }));
    const stateBlock = renderState(fromJson(ValueSchema, claimed.state as JsonValue));
    // The deadline a Decide call of these questions would get now (on the embedded model, after the queue ahead); refused, the example waits.
    const plan = planDecision(engines, deps.llm, stateBlock, specs, undefined);
    if (!plan.run) return { kind: "retry", error: "model_busy" };
    try {
      return await decideExample(claimed, engine, stateBlock, specs, plan.timeoutMs);
    } finally {
      plan.giveBack();
    }
  }

  async function decideExample(claimed: ClaimedExample, engine: DecisionEngine, stateBlock: string, specs: QuestionSpec[], timeoutMs: number): Promise<ExampleOutcome> {
    const reserveUnits = decisionReserveUnits(specs.length);
    const admission = await admitExampleHold(db, { evaluationId: claimed.evaluationId, requestId: claimed.requestId, reserveUnits });
    if (admission.outcome === "credit_cap") return { kind: "stopped", reason: "CREDIT_CAP" };
    if (admission.outcome === "insufficient_balance") return { kind: "stopped", reason: "INSUFFICIENT_BALANCE" };
    if (admission.outcome !== "admitted") return { kind: "retry", error: admission.outcome };
    if (timeoutMs > deps.requestTimeoutMs && !(await extendExampleLease(db, claimed, timeoutMs + deps.leaseMarginMs))) return { kind: "retry", error: "lease_lost" };
    const work = linkedSignal([stopping.signal], timeoutMs);
    try {
      const result = await engine.decide({ stateBlock, questions: specs }, { signal: work.signal, deadlineMs: engineDeadlineMs(timeoutMs), party });
      if (stopping.signal.aborted) return { kind: "retry", error: "shutdown" };
      if (result.answered === 0) {
        const first = result.answers[0]?.[1];
        const error = first?.code ?? "upstream_error";
        return first?.retryable && claimed.attempts < MAX_EXAMPLE_ATTEMPTS ? { kind: "retry", error } : { kind: "failed", error };
      }
      const answers = Object.fromEntries(result.answers.map(([key, init]) => [key, toJson(AnswerSchema, create(AnswerSchema, init))]));
      return { kind: "answered", answers, chargeUnits: Math.min(result.usage.inputTokens, reserveUnits), upstream: engines.upstream, promptVersion: PROMPT_VERSION };
    } finally {
      work.dispose();
    }
  }

  async function tick(): Promise<void> {
    if (++ticks % 10 === 1) await releaseOrphanedExamples(db);
    const free = config.examplesInFlight - running.size;
    if (free <= 0 || !engines.current()) return;
    const claimed = await claimExamples(db, { max: free, leaseMs, token: crypto.randomUUID() });
    for (const example of claimed) {
      const task = runExample(example)
        .catch(() => false)
        .then((ended) => {
          running.delete(task);
          if (ended) wake();
        });
      running.add(task);
    }
  }

  async function run(): Promise<void> {
    while (!stopping.signal.aborted) {
      try {
        await tick();
      } catch (err) {
        logger.warn("evaluation runner tick failed", { err });
      }
      if (stopping.signal.aborted) break;
      if (woken) {
        woken = false;
        continue;
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, config.pollIntervalMs);
        function done() {
          clearTimeout(timer);
          woken = false;
          wakeNow = undefined;
          stopping.signal.removeEventListener("abort", done);
          resolve();
        }
        wakeNow = done;
        stopping.signal.addEventListener("abort", done, { once: true });
      });
    }
  }

  return {
    start() {
      if (loop || config.examplesInFlight === 0) return;
      loop = run();
    },
    wake,
    async stop() {
      stopping.abort();
      await loop;
      await Promise.all([...running]);
    },
    inFlight: () => running.size,
  };
}
