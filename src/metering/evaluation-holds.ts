import type { Knex } from "knex";

/**
 * Holds of an evaluation's examples (migration create_evaluations): the same
 * accounts, requests and ledger rows as a call's hold, outside the API's
 * limits. Each function is one statement; the caller decides the transaction,
 * so the evaluation runner settles an example and records its outcome in one.
 */

export type ExampleAdmission =
  | { outcome: "admitted"; requestId: string; reservedUnits: number }
  /** The hold was already settled or released: the example's outcome was recorded with it. */
  | { outcome: "finished"; requestId: string }
  /** Refused for now, while the evaluation's own holds are out: they may give money back. */
  | { outcome: "wait" }
  | { outcome: "credit_cap"; capLeftUnits: number; reservedUnits: number }
  | { outcome: "insufficient_balance"; availableUnits: number; reservedUnits: number }
  | { outcome: "not_found" };

interface DbExampleAdmissionRow {
  outcome: ExampleAdmission["outcome"];
  request_id: string;
  reserved: string | number | null;
  available: string | number | null;
  cap_left: string | number | null;
}

/**
 * Holds `reserveUnits` for one example under `requestId`, unless the
 * evaluation's cap (charged + held + this) or the account's available balance
 * refuses it. Admitting an id that already holds answers `admitted` and holds
 * nothing more, so a replica that takes over an example reuses its hold.
 */
export async function admitExampleHold(
  db: Knex | Knex.Transaction,
  input: { evaluationId: string; requestId: string; reserveUnits: number; now?: Date },
): Promise<ExampleAdmission> {
  const { rows } = await db.raw<{ rows: DbExampleAdmissionRow[] }>(
    "SELECT * FROM evaluation_admit_example(?::uuid, ?::uuid, ?::bigint, ?::timestamptz)",
    [input.evaluationId, input.requestId, input.reserveUnits, input.now ?? null],
  );
  const row = rows[0]!;
  switch (row.outcome) {
    case "admitted":
      return { outcome: "admitted", requestId: row.request_id, reservedUnits: Number(row.reserved) };
    case "finished":
      return { outcome: "finished", requestId: row.request_id };
    case "wait":
      return { outcome: "wait" };
    case "credit_cap":
      return { outcome: "credit_cap", capLeftUnits: Number(row.cap_left), reservedUnits: Number(row.reserved) };
    case "insufficient_balance":
      return { outcome: "insufficient_balance", availableUnits: Number(row.available), reservedUnits: Number(row.reserved) };
    default:
      return { outcome: "not_found" };
  }
}

export type ExampleFinish = { outcome: "settled" | "released" | "not_active" | "not_found"; chargedUnits: number };

/** Settles (charging `chargeUnits`, capped at the hold) or releases an example's hold; a hold finishes at most once. */
export async function finishExampleHold(
  db: Knex | Knex.Transaction,
  input: { requestId: string; success: boolean; chargeUnits: number; now?: Date },
): Promise<ExampleFinish> {
  const { rows } = await db.raw<{ rows: Array<{ outcome: ExampleFinish["outcome"]; charged: string | number | null }> }>(
    "SELECT * FROM evaluation_resolve_example(?::uuid, ?::boolean, ?::bigint, ?::timestamptz)",
    [input.requestId, input.success, input.chargeUnits, input.now ?? null],
  );
  const row = rows[0]!;
  return { outcome: row.outcome, chargedUnits: Number(row.charged ?? 0) };
}
