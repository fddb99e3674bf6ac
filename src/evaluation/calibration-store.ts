import type { Knex } from "knex";
import type { CalibrationParams } from "./calibration-apply.js";
import type { HeldOutMetrics } from "./calibration-fit.js";

/** What a calibration applies to: a decision's question must match every part. */
export interface CalibrationSignature {
  type: "noul" | "choice" | "score";
  instructions: string;
  /** choice: the options in canonical order; score: the labels, lowest first; noul: none. */
  labels: string[];
  promptVersion: string;
  model: string;
  upstream: string;
}

export interface DbCalibrationRow {
  id: string;
  account_id: string;
  evaluation_id: string;
  question_key: string;
  method: CalibrationParams["method"];
  question_type: CalibrationSignature["type"];
  instructions: string;
  labels: string[];
  prompt_version: string;
  model: string;
  upstream: string;
  signature: string;
  version: number;
  parameters: CalibrationParams;
  held_out: { folds: number; seed: number; before: HeldOutMetrics; after: HeldOutMetrics };
  created_by: string;
  created_at: Date;
}

export type NewCalibration = Omit<DbCalibrationRow, "id" | "version" | "created_at">;

/** The columns that store a signature, beside its digest (which the caller computes: the digest is the signature's own module's). */
export function signatureColumns(signature: CalibrationSignature, digest: string): Pick<NewCalibration, "question_type" | "instructions" | "labels" | "prompt_version" | "model" | "upstream" | "signature"> {
  return {
    question_type: signature.type,
    instructions: signature.instructions,
    labels: signature.labels,
    prompt_version: signature.promptVersion,
    model: signature.model,
    upstream: signature.upstream,
    signature: digest,
  };
}

/** Unique violation: another fit of the same signature took the version first. */
const UNIQUE_VIOLATION = "23505";
const VERSION_ATTEMPTS = 5;

/** Stores a fit as the next version of its signature in the account; rows are never updated afterwards. */
export async function insertCalibration(db: Knex, input: NewCalibration): Promise<DbCalibrationRow> {
  for (let attempt = 1; ; attempt++) {
    try {
      const { rows } = await db.raw<{ rows: DbCalibrationRow[] }>(
        `INSERT INTO calibrations (account_id, evaluation_id, question_key, method, question_type, instructions, labels,
           prompt_version, model, upstream, signature, version, parameters, held_out, created_by)
         SELECT ?, ?, ?, ?, ?, ?, ?::text[], ?, ?, ?, ?,
           coalesce((SELECT max(version) FROM calibrations WHERE account_id = ? AND signature = ?), 0) + 1, ?::jsonb, ?::jsonb, ?
         RETURNING *`,
        [
          input.account_id,
          input.evaluation_id,
          input.question_key,
          input.method,
          input.question_type,
          input.instructions,
          input.labels,
          input.prompt_version,
          input.model,
          input.upstream,
          input.signature,
          input.account_id,
          input.signature,
          JSON.stringify(input.parameters),
          JSON.stringify(input.held_out),
          input.created_by,
        ],
      );
      return rows[0]!;
    } catch (error) {
      if ((error as { code?: string }).code !== UNIQUE_VIOLATION || attempt >= VERSION_ATTEMPTS) throw error;
    }
  }
}

export async function findCalibration(db: Knex | Knex.Transaction, accountId: string, id: string): Promise<DbCalibrationRow | undefined> {
  return db<DbCalibrationRow>("calibrations").where({ account_id: accountId, id }).first();
}

/** The calibrations of these ids (primary-key reads) that belong to the account. */
export async function findCalibrations(db: Knex | Knex.Transaction, accountId: string, ids: readonly string[]): Promise<DbCalibrationRow[]> {
  return db<DbCalibrationRow>("calibrations").where({ account_id: accountId }).whereIn("id", [...ids]);
}

/** Newest first, after the cursor (exclusive). */
export async function listCalibrations(
  db: Knex | Knex.Transaction,
  accountId: string,
  limit: number,
  after?: { createdAt: Date; id: string },
): Promise<DbCalibrationRow[]> {
  const query = db<DbCalibrationRow>("calibrations").where({ account_id: accountId });
  if (after) query.whereRaw("(created_at, id) < (?::timestamptz, ?::uuid)", [after.createdAt, after.id]);
  return query.orderBy([{ column: "created_at", order: "desc" }, { column: "id", order: "desc" }]).limit(limit);
}
