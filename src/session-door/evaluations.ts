import type { ServiceImpl } from "@connectrpc/connect";
import type { Knex } from "knex";
import { isUuid } from "../validation.js";
import { apiError } from "../errors.js";
import { changeEvaluation, createEvaluation, deleteEvaluationRecorded, evaluationMessage } from "../evaluation/evaluations.js";
import { exampleFromMessage } from "../evaluation/examples.js";
import { evaluationResults } from "../evaluation/results.js";
import { calibrationMessage, fitFromEvaluation } from "../evaluation/calibrations.js";
import { findCalibration, listCalibrations } from "../evaluation/calibration-store.js";
import { findEvaluation, listEvaluations, type EvaluationView } from "../evaluation/store.js";
import type { AccountService } from "../gen/typesafe/account/v1/account_service_pb.js";
import { UNITS_PER_CREDIT, unitsToCredits } from "../units.js";
import { throwIfInvalid } from "../validation.js";
import { allowed } from "./access.js";
import { decodePageToken, encodePageToken } from "../metering/usage-query.js";

type EvaluationMethods = Pick<
  ServiceImpl<typeof AccountService>,
  | "createEvaluation"
  | "listEvaluations"
  | "getEvaluation"
  | "cancelEvaluation"
  | "resumeEvaluation"
  | "deleteEvaluation"
  | "getEvaluationResults"
  | "fitCalibration"
  | "getCalibration"
  | "listCalibrations"
>;

export interface EvaluationMethodsDeps {
  db: Knex;
  now: () => Date;
  /** Tells this replica's runner that there is work now. */
  wakeRunner: () => void;
}

const MAX_EVALUATIONS_PAGE = 100;
const DEFAULT_EVALUATIONS_PAGE = 20;

/**
 * The AccountService's evaluation methods: every member reads; owners, admins
 * and members create, cancel, resume and delete (they spend the account's
 * credits, as keys do). Each query is filtered by the member's account, so
 * another account's evaluation is a 404 like one that does not exist.
 */
export function createEvaluationMethods(deps: EvaluationMethodsDeps): EvaluationMethods {
  const { db, now } = deps;

  async function evaluationOf(accountId: string, id: string): Promise<EvaluationView> {
    throwIfInvalid(id === "" ? [{ field: "evaluation_id", rule: "required" }] : []);
    const found = isUuid(id) ? await findEvaluation(db, accountId, id) : undefined;
    if (!found) throw apiError("NOT_FOUND", "no such evaluation", { field: "evaluation_id" });
    return found;
  }

  return {
    async createEvaluation(req, ctx) {
      const member = allowed(ctx, "run_evaluations");
      const row = await createEvaluation(db, {
        accountId: member.accountId,
        createdBy: member.email,
        name: req.name,
        questions: req.questions,
        examples: req.examples.map((e, i) => exampleFromMessage(e, i + 1)),
        capUnits: creditsToUnits(req.creditCapCredits),
        examplesInFlight: req.examplesInFlight,
        fieldOf: (v) => `examples[${v.line - 1}]${v.field === "" ? "" : `.${v.field}`}`,
        at: now(),
      });
      deps.wakeRunner();
      return { evaluation: evaluationMessage(row) };
    },

    async listEvaluations(req, ctx) {
      const member = allowed(ctx, "read");
      const size = req.pageSize === 0 ? DEFAULT_EVALUATIONS_PAGE : req.pageSize;
      throwIfInvalid(size < 1 || size > MAX_EVALUATIONS_PAGE ? [{ field: "page_size", rule: `from 1 to ${MAX_EVALUATIONS_PAGE}, or 0 for ${DEFAULT_EVALUATIONS_PAGE}` }] : []);
      const position = decodePageToken(req.pageToken);
      throwIfInvalid(position && !isUuid(position.id) ? [{ field: "page_token", rule: "the next_page_token of an earlier page" }] : []);
      const rows = await listEvaluations(db, member.accountId, size + 1, position && { createdAt: position.at, id: position.id });
      const page = rows.slice(0, size);
      const last = page.at(-1);
      return { evaluations: page.map(evaluationMessage), nextPageToken: rows.length > size && last ? encodePageToken(last.created_at, last.id) : "" };
    },

    async getEvaluation(req, ctx) {
      const member = allowed(ctx, "read");
      return { evaluation: evaluationMessage(await evaluationOf(member.accountId, req.evaluationId)) };
    },

    async cancelEvaluation(req, ctx) {
      const member = allowed(ctx, "run_evaluations");
      await evaluationOf(member.accountId, req.evaluationId);
      const { row, changed } = await changeEvaluation(db, { accountId: member.accountId, actor: member.email, at: now() }, req.evaluationId, { action: "cancel" });
      if (!row) throw apiError("NOT_FOUND", "no such evaluation", { field: "evaluation_id" });
      if (!changed) throw stateError(row.state, "cancel", "only a running or stopped evaluation can be cancelled");
      return { evaluation: evaluationMessage(await evaluationOf(member.accountId, row.id)) };
    },

    async resumeEvaluation(req, ctx) {
      const member = allowed(ctx, "run_evaluations");
      const current = await evaluationOf(member.accountId, req.evaluationId);
      const capUnits = req.creditCapCredits === 0 ? undefined : creditsToUnits(req.creditCapCredits);
      if (capUnits !== undefined) {
        throwIfInvalid(
          !Number.isSafeInteger(capUnits) || capUnits <= current.charged_units
            ? [{ field: "credit_cap_credits", rule: `above what was charged (${unitsToCredits(current.charged_units)} credits), with at most 6 decimals` }]
            : [],
        );
      }
      const { row, changed } = await changeEvaluation(db, { accountId: member.accountId, actor: member.email, at: now() }, req.evaluationId, { action: "resume", capUnits });
      if (!row) throw apiError("NOT_FOUND", "no such evaluation", { field: "evaluation_id" });
      if (!changed) throw stateError(row.state, "resume", "only a stopped evaluation can be resumed");
      deps.wakeRunner();
      return { evaluation: evaluationMessage(await evaluationOf(member.accountId, row.id)) };
    },

    async deleteEvaluation(req, ctx) {
      const member = allowed(ctx, "run_evaluations");
      const current = await evaluationOf(member.accountId, req.evaluationId);
      const outcome = await deleteEvaluationRecorded(db, { accountId: member.accountId, actor: member.email, at: now() }, current);
      if (outcome === "not_found") throw apiError("NOT_FOUND", "no such evaluation", { field: "evaluation_id" });
      if (outcome === "busy") throw stateError(current.state, "delete", "a running evaluation, or one with examples still in flight, cannot be deleted: cancel it first");
      return {};
    },

    async getEvaluationResults(req, ctx) {
      const member = allowed(ctx, "read");
      const evaluation = await evaluationOf(member.accountId, req.evaluationId);
      const results = await evaluationResults(db, evaluation);
      return { evaluation: evaluationMessage(evaluation), ...results };
    },

    async fitCalibration(req, ctx) {
      const member = allowed(ctx, "run_evaluations");
      const evaluation = await evaluationOf(member.accountId, req.evaluationId);
      const row = await fitFromEvaluation(db, { evaluation, questionKey: req.questionKey, method: req.method, createdBy: member.email, at: now() });
      return { calibration: calibrationMessage(row) };
    },

    async getCalibration(req, ctx) {
      const member = allowed(ctx, "read");
      throwIfInvalid(req.calibrationId === "" ? [{ field: "calibration_id", rule: "required" }] : []);
      const row = isUuid(req.calibrationId) ? await findCalibration(db, member.accountId, req.calibrationId) : undefined;
      if (!row) throw apiError("NOT_FOUND", "no such calibration", { field: "calibration_id" });
      return { calibration: calibrationMessage(row) };
    },

    async listCalibrations(req, ctx) {
      const member = allowed(ctx, "read");
      const size = req.pageSize === 0 ? DEFAULT_EVALUATIONS_PAGE : req.pageSize;
      throwIfInvalid(size < 1 || size > MAX_EVALUATIONS_PAGE ? [{ field: "page_size", rule: `from 1 to ${MAX_EVALUATIONS_PAGE}, or 0 for ${DEFAULT_EVALUATIONS_PAGE}` }] : []);
      const position = decodePageToken(req.pageToken);
      throwIfInvalid(position && !isUuid(position.id) ? [{ field: "page_token", rule: "the next_page_token of an earlier page" }] : []);
      const rows = await listCalibrations(db, member.accountId, size + 1, position && { createdAt: position.at, id: position.id });
      const page = rows.slice(0, size);
      const last = page.at(-1);
      return { calibrations: page.map(calibrationMessage), nextPageToken: rows.length > size && last ? encodePageToken(last.created_at, last.id) : "" };
    },
  };
}

function stateError(state: string, action: string, rule: string) {
  return apiError("EVALUATION_STATE", `${rule} (this one is ${state})`, { rule, metadata: { state, action } });
}

/** Credits as sent (a double) to integer units; NaN or more than 6 decimals give a non-integer, which validation refuses. */
export function creditsToUnits(credits: number): number {
  const units = credits * UNITS_PER_CREDIT;
  const rounded = Math.round(units);
  return Math.abs(units - rounded) < 1e-6 ? rounded : units;
}
