import type { Knex } from "knex";
import { expect } from "vitest";

/**
 * The metering invariants, checked from the tables themselves (the counters
 * on `accounts` against the `requests` rows and the `ledger`), so a test
 * fails when any code path lets them drift:
 *   I1 balance = Σ grants − Σ settled charges (ledger and requests agree)
 *   I2 nothing negative; reserved ≤ balance; free held ≤ free remaining
 *   I3 reserved / free_reserved = the sums over active holds; in_flight = the active holds of calls (an evaluation example's hold counts in reserved only); in_flight ≤ max
 *   I4 each request: one hold entry, one terminal entry matching its status, charged ≤ reserved
 *   I5 a settle or release entry records the balance and free requests the ledger sums to up to it
 *   I6 free_remaining = Σ free grants − settled free requests
 *   I7 (rate part) no rolling window holds more admissions than the limit
 *   I8 no key with a budget was charged past it in any of its periods, and
 *      its count of the current period equals its settled calls' charges
 */
export async function assertInvariants(db: Knex | Knex.Transaction, accountId: string): Promise<void> {
  const account = await db("accounts").where({ id: accountId }).first();
  expect(account, `account ${accountId} exists`).toBeDefined();

  const ledger = (
    await db.raw<{ rows: { grants: number; charges: number; free_grants: number; free_used: number }[] }>(
      `SELECT coalesce(sum(amount) FILTER (WHERE kind = 'grant'), 0)::bigint AS grants,
              coalesce(sum(amount) FILTER (WHERE kind = 'settle'), 0)::bigint AS charges,
              coalesce(sum(free_units) FILTER (WHERE kind = 'free_grant'), 0)::bigint AS free_grants,
              coalesce(sum(free_units) FILTER (WHERE kind = 'settle'), 0)::bigint AS free_used
         FROM ledger WHERE account_id = ?`,
      [accountId],
    )
  ).rows[0]!;

  const holds = (
    await db.raw<{ rows: { reserved: number; free_held: number; active: number; charged: number; free_settled: number }[] }>(
      `SELECT coalesce(sum(reserved) FILTER (WHERE status = 'active' AND funding = 'paid'), 0)::bigint AS reserved,
              count(*) FILTER (WHERE status = 'active' AND funding = 'free')::int AS free_held,
              count(*) FILTER (WHERE status = 'active' AND evaluation_id IS NULL)::int AS active,
              coalesce(sum(charged) FILTER (WHERE status = 'settled'), 0)::bigint AS charged,
              count(*) FILTER (WHERE status = 'settled' AND funding = 'free')::int AS free_settled
         FROM requests WHERE account_id = ?`,
      [accountId],
    )
  ).rows[0]!;

  // I4: one row per request that breaks the resolve-at-most-once rules.
  const badRequests = (
    await db.raw<{ rows: { id: string; status: string; holds: number; terminal: string[]; charged: number; reserved: number }[] }>(
      `SELECT r.id, r.status, r.charged, r.reserved,
              count(l.id) FILTER (WHERE l.kind = 'hold')::int AS holds,
              coalesce(array_agg(l.kind::text) FILTER (WHERE l.kind <> 'hold'), '{}') AS terminal
         FROM requests r LEFT JOIN ledger l ON l.request_id = r.id
        WHERE r.account_id = ?
        GROUP BY r.id
       HAVING count(l.id) FILTER (WHERE l.kind = 'hold') <> 1
           OR r.charged > r.reserved
           OR (r.charged > 0 AND NOT (r.status = 'settled' AND r.funding = 'paid'))
           OR (r.status = 'active') <> (r.resolved_at IS NULL)
           OR coalesce(array_agg(l.kind::text) FILTER (WHERE l.kind <> 'hold'), '{}') <>
              CASE r.status WHEN 'active' THEN '{}'::text[]
                            WHEN 'settled' THEN '{settle}'::text[]
                            WHEN 'released' THEN '{release}'::text[]
                            ELSE '{expire}'::text[] END
           OR sum(l.amount) FILTER (WHERE l.kind = 'settle') IS DISTINCT FROM
              CASE WHEN r.status = 'settled' THEN r.charged END`,
      [accountId],
    )
  ).rows;

  // I5: entries whose recorded account figures differ from the ledger's running sums (entries of one account are written in order under its row lock).
  const misrecorded = (
    await db.raw<{ rows: { id: string; kind: string; balance_after: string; balance: string; free_remaining_after: number; free_remaining: string }[] }>(
      `SELECT e.id, e.kind, e.balance_after, e.balance, e.free_remaining_after, e.free_remaining FROM (
         SELECT l.id, l.kind::text AS kind, l.balance_after, l.free_remaining_after,
                sum(CASE l.kind::text WHEN 'grant' THEN l.amount WHEN 'settle' THEN -l.amount ELSE 0 END) OVER running AS balance,
                sum(CASE l.kind::text WHEN 'free_grant' THEN l.free_units WHEN 'settle' THEN -l.free_units ELSE 0 END) OVER running AS free_remaining
           FROM ledger l WHERE l.account_id = ?
         WINDOW running AS (ORDER BY l.id)) e
        WHERE e.balance_after IS NOT NULL AND (e.balance_after <> e.balance OR e.free_remaining_after <> e.free_remaining)`,
      [accountId],
    )
  ).rows;

  // I7: the most admissions of calls in any rolling window ending at an admission (an evaluation's examples are outside the rolling minute).
  const busiest = (
    await db.raw<{ rows: { most: number }[] }>(
      `SELECT coalesce(max(c), 0)::int AS most FROM (
         SELECT count(*) OVER (ORDER BY created_at RANGE BETWEEN ?::interval PRECEDING AND CURRENT ROW) AS c
           FROM requests WHERE account_id = ? AND evaluation_id IS NULL) w`,
      [`${account.rate_window_ms - 1} milliseconds`, accountId],
    )
  ).rows[0]!;

  // I8: per key and budget period, the charges of its settled calls (a budget's period is read on the database's UTC calendar).
  const keysOverBudget = (
    await db.raw<{ rows: { key_id: string; period_start: string; charged: number; budget: number }[] }>(
      `SELECT k.id AS key_id, metering_key_period_start(k.budget_period, r.resolved_at) AS period_start,
              sum(r.charged)::bigint AS charged, k.budget_units AS budget
         FROM api_keys k JOIN requests r ON r.key_id = k.id AND r.status = 'settled'
        WHERE k.account_id = ? AND k.budget_units IS NOT NULL
        GROUP BY k.id, 2
       HAVING sum(r.charged) > k.budget_units`,
      [accountId],
    )
  ).rows;
  const keysMiscounted = (
    await db.raw<{ rows: { key_id: string; budget_spent: number; charged: number }[] }>(
      `SELECT k.id AS key_id, k.budget_spent, coalesce(sum(r.charged), 0)::bigint AS charged
         FROM api_keys k LEFT JOIN requests r ON r.key_id = k.id AND r.status = 'settled' AND r.resolved_at >= k.budget_period_start
        WHERE k.account_id = ? AND k.budget_period_start IS NOT NULL
        GROUP BY k.id
       HAVING k.budget_spent <> coalesce(sum(r.charged), 0)`,
      [accountId],
    )
  ).rows;

  expect({
    I1_balance_equals_grants_minus_charges: account.balance === ledger.grants - ledger.charges,
    I1_ledger_charges_equal_request_charges: ledger.charges === holds.charged,
    I2_nothing_negative:
      account.balance >= 0 && account.reserved >= 0 && account.free_remaining >= 0 && account.free_reserved >= 0 && account.in_flight >= 0,
    I2_reserved_within_balance: account.reserved <= account.balance,
    I2_free_held_within_free_remaining: account.free_reserved <= account.free_remaining,
    I3_reserved_equals_active_paid_holds: account.reserved === holds.reserved,
    I3_free_reserved_equals_active_free_holds: account.free_reserved === holds.free_held,
    I3_in_flight_equals_active_holds: account.in_flight === holds.active,
    I3_in_flight_within_max: account.in_flight <= account.max_in_flight,
    I4_requests_breaking_resolve_once: badRequests,
    I5_entries_misrecording_the_account: misrecorded,
    I6_free_remaining_equals_grants_minus_used: account.free_remaining === ledger.free_grants - ledger.free_used,
    I6_free_used_equals_settled_free_requests: ledger.free_used === holds.free_settled,
    I7_rate_log_within_limit: account.recent.length <= account.rate_limit,
    I7_rolling_window_within_limit: busiest.most <= account.rate_limit,
    I8_keys_over_budget: keysOverBudget,
    I8_keys_miscounting_their_period: keysMiscounted,
  }).toEqual({
    I1_balance_equals_grants_minus_charges: true,
    I1_ledger_charges_equal_request_charges: true,
    I2_nothing_negative: true,
    I2_reserved_within_balance: true,
    I2_free_held_within_free_remaining: true,
    I3_reserved_equals_active_paid_holds: true,
    I3_free_reserved_equals_active_free_holds: true,
    I3_in_flight_equals_active_holds: true,
    I3_in_flight_within_max: true,
    I4_requests_breaking_resolve_once: [],
    I5_entries_misrecording_the_account: [],
    I6_free_remaining_equals_grants_minus_used: true,
    I6_free_used_equals_settled_free_requests: true,
    I7_rate_log_within_limit: true,
    I7_rolling_window_within_limit: true,
    I8_keys_over_budget: [],
    I8_keys_miscounting_their_period: [],
  });
}
