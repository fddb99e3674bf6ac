import type { Knex } from "knex";
import { isUuid } from "../validation.js";

/** What can happen to an account, as its activity log names it. */
export const ACTIVITY_KINDS = [
  "signed_in",
  "sign_in_failed",
  "signed_out",
  "invite_accepted",
  "key_created",
  "key_revoked",
  "key_limits_changed",
  "key_rolled",
  "credits_granted",
  "member_invited",
  "member_removed",
  "member_role_changed",
  "two_factor_enabled",
  "two_factor_disabled",
  "two_factor_required_changed",
  "alerts_set",
  "webhook_endpoint_added",
  "webhook_endpoint_removed",
  "webhook_secret_rotated",
  "webhook_endpoint_disabled",
  "webhook_endpoint_enabled",
  "evaluation_created",
  "evaluation_cancelled",
  "evaluation_resumed",
  "evaluation_deleted",
  "evaluation_stopped",
  "evaluation_finished",
  "calibration_fitted",
] as const;
export type ActivityKind = (typeof ACTIVITY_KINDS)[number];

/** Who did something from the CLI. */
export const OPERATOR = "operator";
/** Who did what the service did by itself (an evaluation its runner stopped or finished); no member's email is without an "@". */
export const SYSTEM = "system";

/** A row of `account_activity`. */
export interface DbActivityRow {
  id: string;
  account_id: string;
  kind: ActivityKind;
  actor: string;
  detail: string;
  at: Date;
}

/**
 * Records one event of the account; written by the account area, the CLI and
 * the evaluation runner, never by an API call. `at` may be the database's
 * clock (a Knex raw), as the rows the event is about use.
 */
export async function recordActivity(
  db: Knex | Knex.Transaction,
  event: { accountId: string; kind: ActivityKind; actor: string; detail?: string; at: Date | Knex.Raw },
): Promise<void> {
  await db("account_activity").insert({ account_id: event.accountId, kind: event.kind, actor: event.actor, detail: event.detail ?? "", at: event.at });
}

/** Where a page of activity starts: after this event (exclusive), newest first. */
export interface ActivityCursor {
  at: Date;
  id: string;
}

/** One page of the account's events, newest first, and whether more follow. */
export async function listActivity(
  db: Knex | Knex.Transaction,
  accountId: string,
  page: { size: number; after?: ActivityCursor },
): Promise<{ rows: DbActivityRow[]; more: boolean }> {
  if (!isUuid(accountId)) return { rows: [], more: false };
  const query = db<DbActivityRow>("account_activity").where({ account_id: accountId });
  if (page.after) query.whereRaw("(at, id) < (?, ?)", [page.after.at, page.after.id]);
  const rows = await query.orderBy([{ column: "at", order: "desc" }, { column: "id", order: "desc" }]).limit(page.size + 1);
  return { rows: rows.slice(0, page.size).map((r) => ({ ...r, id: String(r.id) })), more: rows.length > page.size };
}
