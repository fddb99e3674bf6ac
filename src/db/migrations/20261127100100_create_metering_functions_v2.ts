import type { Knex } from "knex";
import type { SchemaMigration } from "./schema-migration.js";

/**
 * The metering functions of this release: as those of the previous one, and
 * a key's own limits are checked and charged inside the account's admission
 * and settle, under the same account row lock, in the same transaction.
 * The previous release's functions (metering_admit, metering_resolve and the
 * functions built on them) stay as they are, for its replicas during a
 * rollout; nothing here changes them.
 *
 * The key's rules are small functions of their own (metering_key_*), so the
 * admission and the settle read as the account's steps plus one call each:
 * - metering_key_period_start: the start, in UTC, of a budget period
 *   (day, week from Monday, month, or the key's whole life);
 * - metering_key_spent: what a key was charged in the current period;
 * - metering_key_held: what its active calls hold now, summed from the
 *   account's active requests (at most its calls in flight), so holds given
 *   back by any release's expiry or sweep leave nothing stale behind;
 * - metering_key_charge: adds a settled charge to the key's period.
 *
 * The budget's invariant: spent in the current period + held ≤ budget.
 * An admission keeps it (it checks before it holds), a settle keeps it (a
 * charge is at most its hold, and moves from held to spent), and a new period
 * only lowers spent. So no key is charged past its budget in any period,
 * however calls interleave, fail or retry: a lost reply's retry finds its
 * request no longer active and charges nothing twice.
 *
 * The order of an admission: unknown key (401), expired key (401), scope
 * (403), then under the account's lock idempotency, the account's rate, the
 * key's rate, concurrency, the account's balance and the key's budget (402).
 * A refused call writes nothing.
 *
 * metering_abandon stays the previous release's: it only releases, which never
 * touches a key's budget.
 */
export const createMeteringFunctionsV2: SchemaMigration = {
  name: "20261127100100_create_metering_functions_v2",
  transactional: true,
  async up(db: Knex | Knex.Transaction): Promise<void> {
    await db.raw(SQL);
  },
};

const SQL = `
  CREATE TYPE metering_admission_v2 AS (
    outcome text,
    request_id uuid,
    account_id uuid,
    funding text,
    reserved bigint,
    charged bigint,
    required bigint,
    balance bigint,
    available bigint,
    free_remaining integer,
    free_available integer,
    in_flight integer,
    max_in_flight integer,
    rate_limit integer,
    rate_remaining integer,
    rate_reset_ms integer,
    retry_after_ms integer,
    response jsonb,
    key_id uuid,
    key_expires_at timestamptz,
    key_budget bigint,
    key_budget_period text,
    key_spent bigint,
    key_held bigint
  );

  -- The start of the budget period that contains p_now, in UTC; a total budget has one period.
  CREATE FUNCTION metering_key_period_start(p_period text, p_now timestamptz)
  RETURNS timestamptz LANGUAGE sql STABLE AS $fn$
    SELECT CASE WHEN p_period = 'total' THEN '-infinity'::timestamptz ELSE date_trunc(p_period, p_now, 'UTC') END;
  $fn$;

  -- Units charged to a key in the period that contains p_now.
  CREATE FUNCTION metering_key_spent(p_spent bigint, p_period_start timestamptz, p_period text, p_now timestamptz)
  RETURNS bigint LANGUAGE sql STABLE AS $fn$
    SELECT CASE WHEN p_period_start = metering_key_period_start(p_period, p_now) THEN p_spent ELSE 0 END;
  $fn$;

  -- Units held by a key's calls in flight. The caller holds the account's row lock.
  CREATE FUNCTION metering_key_held(p_account_id uuid, p_key_id uuid)
  RETURNS bigint LANGUAGE sql STABLE AS $fn$
    SELECT coalesce(sum(r.reserved), 0)::bigint FROM requests r
     WHERE r.account_id = p_account_id AND r.status = 'active' AND r.key_id = p_key_id;
  $fn$;

  -- Adds a settled charge to its key's current period; keys without a budget keep no count.
  -- The caller holds the account's row lock.
  CREATE FUNCTION metering_key_charge(p_key_id uuid, p_units bigint, p_now timestamptz)
  RETURNS void LANGUAGE sql AS $fn$
    UPDATE api_keys k
       SET budget_spent = metering_key_spent(k.budget_spent, k.budget_period_start, k.budget_period, p_now) + p_units,
           budget_period_start = metering_key_period_start(k.budget_period, p_now)
     WHERE k.id = p_key_id AND k.budget_units IS NOT NULL;
  $fn$;

  CREATE FUNCTION metering_admit_v2(
    p_key_hash bytea,
    p_endpoint text,
    p_reserve bigint,
    p_free_ok boolean,
    p_lease_ms integer,
    p_idempotency_key text DEFAULT NULL,
    p_request_hash bytea DEFAULT NULL,
    p_now timestamptz DEFAULT NULL,
    p_request_id uuid DEFAULT NULL
  ) RETURNS metering_admission_v2 LANGUAGE plpgsql AS $fn$
  DECLARE
    res metering_admission_v2;
    a accounts%ROWTYPE;
    k api_keys%ROWTYPE;
    prior requests%ROWTYPE;
    v_now timestamptz;
    v_window interval;
    v_kept timestamptz[];
    v_used integer;
    v_key_kept timestamptz[];
    v_key_used integer;
    v_key_limit integer;
    v_has_prior boolean := false;
    v_funding text;
    v_reserve bigint;
    v_free integer;
  BEGIN
    IF p_endpoint IS NULL OR p_endpoint NOT IN ('decide', 'search') THEN
      RAISE EXCEPTION 'metering_admit_v2: unknown endpoint %', p_endpoint USING ERRCODE = '22023';
    END IF;
    IF p_reserve IS NULL OR p_reserve < 0 THEN
      RAISE EXCEPTION 'metering_admit_v2: reserve must be >= 0, got %', p_reserve USING ERRCODE = '22023';
    END IF;
    IF p_lease_ms IS NULL OR p_lease_ms <= 0 THEN
      RAISE EXCEPTION 'metering_admit_v2: lease must be > 0 ms, got %', p_lease_ms USING ERRCODE = '22023';
    END IF;

    SELECT * INTO k FROM api_keys WHERE key_hash = p_key_hash AND revoked_at IS NULL;
    IF NOT FOUND THEN
      res.outcome := 'unauthenticated';
      RETURN res;
    END IF;
    res.key_id := k.id;
    res.key_expires_at := k.expires_at;

    -- The key's own refusals need no lock: they hold and write nothing.
    v_now := coalesce(p_now, clock_timestamp());
    IF k.expires_at <= v_now THEN
      res.outcome := 'key_expired';
      RETURN res;
    END IF;
    IF NOT (CASE p_endpoint WHEN 'decide' THEN 'decisions' ELSE 'search' END = ANY (coalesce(k.scopes, ARRAY['decisions', 'search']))) THEN
      res.outcome := 'key_scope_denied';
      RETURN res;
    END IF;

    SELECT * INTO a FROM accounts WHERE id = k.account_id FOR UPDATE;
    -- The key's counters, read again under the lock: the first read may predate a call of the key that just committed.
    IF k.rate_limit IS NOT NULL OR k.budget_units IS NOT NULL THEN
      SELECT * INTO k FROM api_keys WHERE id = k.id;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    IF metering_expire_account(a.id, v_now) > 0 THEN
      SELECT * INTO a FROM accounts WHERE id = k.account_id;
    END IF;

    v_window := make_interval(secs => a.rate_window_ms / 1000.0);
    v_kept := ARRAY(SELECT t FROM unnest(a.recent) AS t WHERE t > v_now - v_window ORDER BY t);
    v_used := cardinality(v_kept);

    res.account_id := a.id;
    res.max_in_flight := a.max_in_flight;
    res.rate_limit := a.rate_limit;
    res.rate_remaining := greatest(a.rate_limit - v_used, 0);
    res.rate_reset_ms := CASE WHEN v_used = 0 THEN 0
      ELSE ceil(extract(epoch FROM (v_kept[1] + v_window - v_now)) * 1000)::integer END;
    res.required := p_reserve;

    -- A key's rate limit is a second sliding log over the account's window, never above the account's limit.
    IF k.rate_limit IS NOT NULL THEN
      v_key_limit := least(k.rate_limit, a.rate_limit);
      v_key_kept := ARRAY(SELECT t FROM unnest(k.recent) AS t WHERE t > v_now - v_window ORDER BY t);
      v_key_used := cardinality(v_key_kept);
      IF v_key_limit - v_key_used < res.rate_remaining THEN
        res.rate_limit := v_key_limit;
        res.rate_remaining := greatest(v_key_limit - v_key_used, 0);
        res.rate_reset_ms := CASE WHEN v_key_used = 0 THEN 0
          ELSE ceil(extract(epoch FROM (v_key_kept[1] + v_window - v_now)) * 1000)::integer END;
      END IF;
    END IF;

    IF k.budget_units IS NOT NULL THEN
      res.key_budget := k.budget_units;
      res.key_budget_period := k.budget_period;
      res.key_spent := metering_key_spent(k.budget_spent, k.budget_period_start, k.budget_period, v_now);
      res.key_held := metering_key_held(a.id, k.id);
    END IF;

    IF p_idempotency_key IS NOT NULL THEN
      SELECT * INTO prior
        FROM requests r
       WHERE r.account_id = a.id AND r.idempotency_key = p_idempotency_key AND r.status IN ('active', 'settled');
      v_has_prior := FOUND;
      -- Keys are remembered for 24 hours, as Stripe does; after that the key is free again.
      IF v_has_prior AND prior.status = 'settled' AND prior.created_at <= v_now - interval '24 hours' THEN
        UPDATE requests SET idempotency_key = NULL, response = NULL WHERE id = prior.id;
        v_has_prior := false;
      END IF;
    END IF;

    IF v_has_prior THEN
      res.request_id := prior.id;
      res.funding := prior.funding;
      res.reserved := prior.reserved;
      res.charged := prior.charged;
      IF prior.endpoint <> p_endpoint OR prior.request_hash IS DISTINCT FROM p_request_hash THEN
        res.outcome := 'idempotency_mismatch';
      ELSIF prior.status = 'active' THEN
        res.outcome := 'idempotency_in_progress';
      ELSE
        res.outcome := 'replay';
        res.response := prior.response;
      END IF;
    ELSIF v_used >= a.rate_limit THEN
      res.outcome := 'rate_limited';
      -- The slot that frees first is the one that brings the count below the limit.
      res.retry_after_ms := greatest(1, ceil(extract(epoch FROM
        (v_kept[v_used - a.rate_limit + 1] + v_window - v_now)) * 1000)::integer);
      res.rate_limit := a.rate_limit;
      res.rate_remaining := 0;
      res.rate_reset_ms := res.retry_after_ms;
    ELSIF v_key_used >= v_key_limit THEN
      res.outcome := 'key_rate_limited';
      res.retry_after_ms := greatest(1, ceil(extract(epoch FROM
        (v_key_kept[v_key_used - v_key_limit + 1] + v_window - v_now)) * 1000)::integer);
      res.rate_limit := v_key_limit;
      res.rate_remaining := 0;
      res.rate_reset_ms := res.retry_after_ms;
    ELSIF a.in_flight >= a.max_in_flight THEN
      res.outcome := 'concurrency_limited';
      -- Holds end when calls finish, which the database cannot predict: a short, fixed hint.
      res.retry_after_ms := 1000;
    ELSE
      IF p_free_ok AND p_endpoint = 'decide' AND a.free_remaining - a.free_reserved > 0 THEN
        v_funding := 'free';
        v_reserve := 0;
        v_free := 1;
      ELSIF a.balance - a.reserved >= p_reserve THEN
        v_funding := 'paid';
        v_reserve := p_reserve;
        v_free := 0;
      END IF;

      IF v_funding IS NULL THEN
        res.outcome := 'insufficient_balance';
      ELSIF v_reserve > 0 AND res.key_budget IS NOT NULL AND res.key_spent + res.key_held + v_reserve > res.key_budget THEN
        res.outcome := 'key_budget_exceeded';
      ELSE
        v_kept := ARRAY(SELECT t FROM unnest(v_kept || v_now) AS t ORDER BY t);
        UPDATE accounts
           SET in_flight = in_flight + 1,
               reserved = reserved + v_reserve,
               free_reserved = free_reserved + v_free,
               recent = v_kept
         WHERE id = a.id
        RETURNING * INTO a;
        IF v_key_limit IS NOT NULL THEN
          v_key_kept := ARRAY(SELECT t FROM unnest(v_key_kept || v_now) AS t ORDER BY t);
          UPDATE api_keys SET recent = v_key_kept WHERE id = k.id;
        END IF;
        INSERT INTO requests (id, account_id, endpoint, funding, reserved, status, created_at,
                              lease_expires_at, idempotency_key, request_hash, key_id)
        VALUES (coalesce(p_request_id, gen_random_uuid()), a.id, p_endpoint, v_funding, v_reserve, 'active', v_now,
                v_now + make_interval(secs => p_lease_ms / 1000.0), p_idempotency_key, p_request_hash, k.id)
        RETURNING id INTO res.request_id;
        INSERT INTO ledger (account_id, request_id, kind, amount, free_units, at)
        VALUES (a.id, res.request_id, 'hold', v_reserve, v_free, v_now);

        res.outcome := 'admitted';
        res.funding := v_funding;
        res.reserved := v_reserve;
        res.charged := 0;
        res.key_held := res.key_held + v_reserve;
        res.rate_remaining := greatest(res.rate_remaining - 1, 0);
        IF res.rate_reset_ms = 0 THEN
          res.rate_reset_ms := ceil(extract(epoch FROM v_window) * 1000)::integer;
        END IF;
      END IF;
    END IF;

    res.balance := a.balance;
    res.available := a.balance - a.reserved;
    res.free_remaining := a.free_remaining;
    res.free_available := a.free_remaining - a.free_reserved;
    res.in_flight := a.in_flight;
    RETURN res;
  END
  $fn$;

  -- metering_admit_v2, refused (by an exception, which rolls the admission
  -- back) when the caller has already abandoned the request id.
  CREATE FUNCTION metering_admit_unless_abandoned_v2(
    p_key_hash bytea,
    p_endpoint text,
    p_reserve bigint,
    p_free_ok boolean,
    p_lease_ms integer,
    p_idempotency_key text DEFAULT NULL,
    p_request_hash bytea DEFAULT NULL,
    p_now timestamptz DEFAULT NULL,
    p_request_id uuid DEFAULT NULL
  ) RETURNS metering_admission_v2 LANGUAGE plpgsql AS $fn$
  DECLARE
    res metering_admission_v2;
  BEGIN
    res := metering_admit_v2(p_key_hash, p_endpoint, p_reserve, p_free_ok, p_lease_ms,
                             p_idempotency_key, p_request_hash, p_now, p_request_id);
    IF res.outcome = 'admitted' AND p_request_id IS NOT NULL THEN
      PERFORM metering_admission_lock(p_request_id);
      IF EXISTS (SELECT 1 FROM abandoned_admissions WHERE request_id = p_request_id) THEN
        RAISE EXCEPTION 'metering_admit_v2: request % was abandoned by its caller; the admission is rolled back', p_request_id;
      END IF;
    END IF;
    RETURN res;
  END
  $fn$;

  -- Several admissions in one transaction, in the order of their accounts' ids (the lock order every batch shares).
  CREATE FUNCTION metering_admit_many_v2(
    p_key_hashes bytea[],
    p_endpoints text[],
    p_reserves bigint[],
    p_free_oks boolean[],
    p_lease_ms integer[],
    p_idempotency_keys text[],
    p_request_hashes bytea[],
    p_nows timestamptz[],
    p_request_ids uuid[]
  ) RETURNS SETOF metering_admission_v2 LANGUAGE plpgsql AS $fn$
  DECLARE
    results metering_admission_v2[] := '{}';
    i integer;
  BEGIN
    FOR i IN
      SELECT item.ord FROM unnest(p_key_hashes) WITH ORDINALITY AS item(key_hash, ord)
        LEFT JOIN api_keys k ON k.key_hash = item.key_hash
       ORDER BY k.account_id, item.ord
    LOOP
      results[i] := metering_admit_unless_abandoned_v2(p_key_hashes[i], p_endpoints[i], p_reserves[i], p_free_oks[i],
        p_lease_ms[i], p_idempotency_keys[i], p_request_hashes[i], p_nows[i], p_request_ids[i]);
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(results);
  END
  $fn$;

  -- metering_resolve, and a settle charges the call's key too (metering_key_charge).
  CREATE FUNCTION metering_resolve_v2(
    p_request_id uuid,
    p_success boolean,
    p_actual bigint DEFAULT NULL,
    p_response jsonb DEFAULT NULL,
    p_now timestamptz DEFAULT NULL
  ) RETURNS metering_resolution LANGUAGE plpgsql AS $fn$
  DECLARE
    res metering_resolution;
    a accounts%ROWTYPE;
    req requests%ROWTYPE;
    entry ledger%ROWTYPE;
    v_account_id uuid;
    v_now timestamptz;
    v_free integer;
  BEGIN
    IF p_success IS NULL THEN
      RAISE EXCEPTION 'metering_resolve_v2: success must be true or false' USING ERRCODE = '22023';
    END IF;
    IF p_actual < 0 THEN
      RAISE EXCEPTION 'metering_resolve_v2: actual must be >= 0, got %', p_actual USING ERRCODE = '22023';
    END IF;
    res.request_id := p_request_id;
    res.requested_charge := p_actual;

    SELECT r.account_id INTO v_account_id FROM requests r WHERE r.id = p_request_id;
    IF NOT FOUND THEN
      res.outcome := 'not_found';
      RETURN res;
    END IF;

    PERFORM 1 FROM accounts WHERE id = v_account_id FOR UPDATE;
    v_now := coalesce(p_now, clock_timestamp());
    PERFORM metering_expire_account(v_account_id, v_now);

    UPDATE requests r
       SET status = CASE WHEN p_success THEN 'settled' ELSE 'released' END,
           charged = CASE WHEN p_success AND r.funding = 'paid' THEN least(coalesce(p_actual, r.reserved), r.reserved) ELSE 0 END,
           response = CASE WHEN p_success AND r.idempotency_key IS NOT NULL THEN p_response END,
           resolved_at = v_now
     WHERE r.id = p_request_id AND r.status = 'active'
    RETURNING r.* INTO req;

    IF NOT FOUND THEN
      SELECT * INTO req FROM requests WHERE id = p_request_id;
      SELECT * INTO a FROM accounts WHERE id = v_account_id;
      res.outcome := 'not_active';
      -- The entry that resolved it says how it left the account; entries written
      -- before these columns existed (and expiries) leave the current figures.
      SELECT * INTO entry FROM ledger l
       WHERE l.request_id = p_request_id AND l.kind IN ('settle', 'release') AND l.balance_after IS NOT NULL;
    ELSE
      v_free := CASE WHEN req.funding = 'free' THEN 1 ELSE 0 END;
      UPDATE accounts
         SET in_flight = in_flight - 1,
             reserved = reserved - req.reserved,
             balance = balance - req.charged,
             free_reserved = free_reserved - v_free,
             free_remaining = free_remaining - CASE WHEN p_success THEN v_free ELSE 0 END
       WHERE id = v_account_id
      RETURNING * INTO a;
      IF req.charged > 0 AND req.key_id IS NOT NULL THEN
        PERFORM metering_key_charge(req.key_id, req.charged, v_now);
      END IF;
      INSERT INTO ledger (account_id, request_id, kind, amount, free_units, at,
                          balance_after, available_after, free_remaining_after, free_available_after)
      VALUES (v_account_id, req.id, CASE WHEN p_success THEN 'settle' ELSE 'release' END,
              CASE WHEN p_success THEN req.charged ELSE req.reserved END, v_free, v_now,
              a.balance, a.balance - a.reserved, a.free_remaining, a.free_remaining - a.free_reserved);
      res.outcome := req.status;
    END IF;

    res.account_id := v_account_id;
    res.status := req.status;
    res.funding := req.funding;
    res.reserved := req.reserved;
    res.charged := req.charged;
    IF entry.balance_after IS NOT NULL THEN
      res.balance := entry.balance_after;
      res.available := entry.available_after;
      res.free_remaining := entry.free_remaining_after;
      res.free_available := entry.free_available_after;
    ELSE
      res.balance := a.balance;
      res.available := a.balance - a.reserved;
      res.free_remaining := a.free_remaining;
      res.free_available := a.free_remaining - a.free_reserved;
    END IF;
    RETURN res;
  END
  $fn$;

  CREATE FUNCTION metering_resolve_many_v2(
    p_request_ids uuid[],
    p_successes boolean[],
    p_actuals bigint[],
    p_responses jsonb[],
    p_nows timestamptz[]
  ) RETURNS SETOF metering_resolution LANGUAGE plpgsql AS $fn$
  DECLARE
    results metering_resolution[] := '{}';
    i integer;
  BEGIN
    FOR i IN
      SELECT item.ord FROM unnest(p_request_ids) WITH ORDINALITY AS item(id, ord)
        LEFT JOIN requests r ON r.id = item.id
       ORDER BY r.account_id, item.ord
    LOOP
      results[i] := metering_resolve_v2(p_request_ids[i], p_successes[i], p_actuals[i], p_responses[i], p_nows[i]);
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(results);
  END
  $fn$;
`;
