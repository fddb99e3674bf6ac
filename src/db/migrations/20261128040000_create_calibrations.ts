import type { SchemaMigration } from "./schema-migration.js";

/**
 * Calibrations: parameters fitted from an evaluation's answers to one
 * question, for that question's signature (type, instructions, labels, prompt
 * version, model and upstream). A new table only; nothing of the previous
 * release changes. Rows are never updated: a new fit is a new row with the
 * next version of its signature, so a decision that names a calibration gets
 * the same mapping for as long as the row exists. evaluation_id records where
 * the fit came from and is no foreign key: deleting the evaluation keeps its
 * calibrations.
 */
export const createCalibrations: SchemaMigration = {
  name: "20261128040000_create_calibrations",
  transactional: true,
  async up(db) {
    await db.raw(SQL);
  },
};

const SQL = `
  CREATE TABLE calibrations (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id uuid NOT NULL REFERENCES accounts (id),
    evaluation_id uuid NOT NULL,
    question_key text NOT NULL,
    method text NOT NULL CHECK (method IN ('platt', 'isotonic', 'temperature', 'vector', 'contextual')),
    question_type text NOT NULL CHECK (question_type IN ('noul', 'choice', 'score')),
    instructions text NOT NULL,
    -- choice: the options in canonical order; score: the labels, lowest first; noul: empty.
    labels text[] NOT NULL,
    prompt_version text NOT NULL,
    model text NOT NULL,
    upstream text NOT NULL,
    -- sha256 of the signature's canonical JSON; versions count per account and signature.
    signature text NOT NULL,
    version integer NOT NULL CHECK (version > 0),
    parameters jsonb NOT NULL,
    held_out jsonb NOT NULL,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (account_id, signature, version)
  );
  CREATE INDEX calibrations_account ON calibrations (account_id, created_at DESC, id DESC);
`;
