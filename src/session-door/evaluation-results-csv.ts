import crypto from "node:crypto";
import { createContextValues } from "@connectrpc/connect";
import type { Knex } from "knex";
import { observeCall, type CallObserver } from "../call/observe.js";
import { apiError } from "../errors.js";
import { evaluationResults } from "../evaluation/results.js";
import { evaluationResultsCsv } from "../evaluation/results-csv.js";
import { findEvaluation } from "../evaluation/store.js";
import { sendError, type NodeRequest, type NodeResponse } from "../http/envelope.js";
import { requestHeaders } from "../http/node-headers.js";
import { isUuid, throwIfInvalid } from "../validation.js";
import { allowedMember } from "./access.js";
import { kMember, openAccountDoor, type AccountDoorOptions } from "./door.js";

/** Where an evaluation's results are downloaded as CSV: `?evaluation_id=`. */
export const EVALUATION_RESULTS_CSV_PATH = "/account/v1/evaluations/results.csv";

/**
 * GET /account/v1/evaluations/results.csv?evaluation_id= : the results of
 * GetEvaluationResults as the CSV file `evals results --csv` prints, byte for
 * byte. The same door as the RPCs and usage.csv (origin, session cookie), the
 * role that reads (viewers too), the member's account in the query, so
 * another account's evaluation, a missing one and a malformed id are the
 * same 404 naming `evaluation_id`, as GetEvaluationResults answers them.
 * At most 40 lines: it is written whole, not streamed.
 */
export function createEvaluationResultsCsvHandler(deps: { db: Knex; door: AccountDoorOptions; observer: CallObserver }) {
  return (req: NodeRequest, res: NodeResponse): void => {
    const requestId = crypto.randomUUID();
    const headers = { "x-request-id": requestId, "cache-control": "no-store" };
    void observeCall(deps.observer, { requestId, procedure: EVALUATION_RESULTS_CSV_PATH, protocol: "gateway" }, async () => {
      if (req.method !== "GET") throw apiError("METHOD_NOT_ALLOWED", `${EVALUATION_RESULTS_CSV_PATH} accepts GET`, { metadata: { allow: "GET" } });
      const values = createContextValues();
      await openAccountDoor(deps.door, { methodName: "EvaluationResultsCsv", header: requestHeaders(req), values });
      const member = allowedMember(values.get(kMember)!, "read");
      const id = new URL(req.url ?? "/", "http://localhost").searchParams.get("evaluation_id") ?? "";
      throwIfInvalid(id === "" ? [{ field: "evaluation_id", rule: "required" }] : []);
      const evaluation = isUuid(id) ? await findEvaluation(deps.db, member.accountId, id) : undefined;
      if (!evaluation) throw apiError("NOT_FOUND", "no such evaluation", { field: "evaluation_id" });
      const body = evaluationResultsCsv(await evaluationResults(deps.db, evaluation));
      res.writeHead(200, {
        ...headers,
        "content-type": "text/csv; charset=utf-8; header=present",
        "content-disposition": `attachment; filename="evaluation-${evaluation.id}.csv"`,
        "content-length": Buffer.byteLength(body),
      });
      res.end(body);
    }).catch((err: unknown) => {
      if (res.headersSent) return void res.destroy();
      if (req.method !== "GET") res.setHeader("allow", "GET");
      sendError(res, err, headers);
    });
  };
}
