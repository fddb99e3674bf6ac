import type { Knex } from "knex";

/**
 * The metering core as PL/pgSQL functions, so that each phase of a metered
 * call is one database round trip and one transaction, whichever replica
 * issues it: replicas share nothing but the database, and no phase can be
 * left half done by a lost connection or a crashed replica.
 *
 * Every function that changes an account locks its row first (`FOR UPDATE`):
 * under Read Committed every later statement then sees the newest committed
 * state, and the fixed order (account row, then its requests) rules out
 * deadlocks between admit, resolve and sweep. Times come from `p_now`, or the
 * database clock read after the lock, so tests move time without sleeping and
 * replicas never disagree about a clock.
 *
 * Ledger amounts are magnitudes; the kind gives the direction:
 *   grant / free_grant  amount / free_units added to balance / free_remaining
 *   hold                amount / free_units reserved (the request's hold)
 *   settle              amount charged to the balance, free_units consumed
 *   release / expire    amount / free_units given back from the hold
 * so balance = Σ grant − Σ settle and free_remaining = Σ free_grant − Σ settle.free_units.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE TYPE metering_admission AS (
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
      response jsonb
    );

    CREATE TYPE metering_resolution AS (
      outcome text,
      request_id uuid,
      account_id uuid,
      status text,
      funding text,
      reserved bigint,
      charged bigint,
      requested_charge bigint,
      balance bigint,
      available bigint,
      free_remaining integer,
      free_available integer
    );

    -- Releases the holds of one account whose lease has passed. The caller
    -- must hold the account's row lock. Returns how many holds expired.
    CREATE FUNCTION metering_expire_account(p_account_id uuid, p_now timestamptz)
    RETURNS integer LANGUAGE plpgsql AS $fn$
    DECLARE
      v_count integer;
      v_units bigint;
      v_free integer;
    BEGIN
      WITH expired AS (
        UPDATE requests r
           SET status = 'expired', resolved_at = p_now
         WHERE r.account_id = p_account_id AND r.status = 'active' AND r.lease_expires_at <= p_now
        RETURNING r.id, r.funding, r.reserved
      ), logged AS (
        INSERT INTO ledger (account_id, request_id, kind, amount, free_units, at)
        SELECT p_account_id, e.id, 'expire', e.reserved, CASE WHEN e.funding = 'free' THEN 1 ELSE 0 END, p_now
          FROM expired e
      )
      SELECT count(*), coalesce(sum(e.reserved), 0), count(*) FILTER (WHERE e.funding = 'free')
        INTO v_count, v_units, v_free
        FROM expired e;
      IF v_count > 0 THEN
        UPDATE accounts
           SET in_flight = in_flight - v_count,
               reserved = reserved - v_units,
               free_reserved = free_reserved - v_free
         WHERE id = p_account_id;
      END IF;
      RETURN v_count;
    END
    $fn$;

    -- Authenticates, expires stale holds, then checks idempotency, rate,
    -- concurrency and funding in that order; only an admission writes.
    CREATE FUNCTION metering_admit(
      p_key_hash bytea,
      p_endpoint text,
      p_reserve bigint,
      p_free_ok boolean,
      p_lease_ms integer,
      p_idempotency_key text DEFAULT NULL,
      p_request_hash bytea DEFAULT NULL,
      p_now timestamptz DEFAULT NULL,
      p_request_id uuid DEFAULT NULL
    ) RETURNS metering_admission LANGUAGE plpgsql AS $fn$
    DECLARE
      res metering_admission;
      a accounts%ROWTYPE;
      prior requests%ROWTYPE;
      v_account_id uuid;
      v_now timestamptz;
      v_window interval;
      v_kept timestamptz[];
      v_used integer;
      v_has_prior boolean := false;
      v_funding text;
      v_reserve bigint;
      v_free integer;
    BEGIN
      IF p_endpoint IS NULL OR p_endpoint NOT IN ('decide', 'search') THEN
        RAISE EXCEPTION 'metering_admit: unknown endpoint %', p_endpoint USING ERRCODE = '22023';
      END IF;
      IF p_reserve IS NULL OR p_reserve < 0 THEN
        RAISE EXCEPTION 'metering_admit: reserve must be >= 0, got %', p_reserve USING ERRCODE = '22023';
      END IF;
      IF p_lease_ms IS NULL OR p_lease_ms <= 0 THEN
        RAISE EXCEPTION 'metering_admit: lease must be > 0 ms, got %', p_lease_ms USING ERRCODE = '22023';
      END IF;

      SELECT k.account_id INTO v_account_id
        FROM api_keys k
       WHERE k.key_hash = p_key_hash AND k.revoked_at IS NULL;
      IF NOT FOUND THEN
        res.outcome := 'unauthenticated';
        RETURN res;
      END IF;

      SELECT * INTO a FROM accounts WHERE id = v_account_id FOR UPDATE;
      v_now := coalesce(p_now, clock_timestamp());
      IF metering_expire_account(a.id, v_now) > 0 THEN
        SELECT * INTO a FROM accounts WHERE id = v_account_id;
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
        ELSE
          v_kept := ARRAY(SELECT t FROM unnest(v_kept || v_now) AS t ORDER BY t);
          UPDATE accounts
             SET in_flight = in_flight + 1,
                 reserved = reserved + v_reserve,
                 free_reserved = free_reserved + v_free,
                 recent = v_kept
           WHERE id = a.id
          RETURNING * INTO a;
          INSERT INTO requests (id, account_id, endpoint, funding, reserved, status, created_at,
                                lease_expires_at, idempotency_key, request_hash)
          VALUES (coalesce(p_request_id, gen_random_uuid()), a.id, p_endpoint, v_funding, v_reserve, 'active', v_now,
                  v_now + make_interval(secs => p_lease_ms / 1000.0), p_idempotency_key, p_request_hash)
          RETURNING id INTO res.request_id;
          INSERT INTO ledger (account_id, request_id, kind, amount, free_units, at)
          VALUES (a.id, res.request_id, 'hold', v_reserve, v_free, v_now);

          res.outcome := 'admitted';
          res.funding := v_funding;
          res.reserved := v_reserve;
          res.charged := 0;
          res.rate_remaining := greatest(a.rate_limit - cardinality(v_kept), 0);
          res.rate_reset_ms := ceil(extract(epoch FROM (v_kept[1] + v_window - v_now)) * 1000)::integer;
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

    -- Settles (success) or releases (failure) one hold, at most once. A
    -- success charges the actual cost capped at the reservation; an unknown
    -- cost (NULL) charges the reservation. A hold whose lease has passed is
    -- expired first, so a late settle is refused whether or not a sweep ran.
    CREATE FUNCTION metering_resolve(
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
      v_account_id uuid;
      v_now timestamptz;
      v_free integer;
    BEGIN
      IF p_success IS NULL THEN
        RAISE EXCEPTION 'metering_resolve: success must be true or false' USING ERRCODE = '22023';
      END IF;
      IF p_actual < 0 THEN
        RAISE EXCEPTION 'metering_resolve: actual must be >= 0, got %', p_actual USING ERRCODE = '22023';
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
        INSERT INTO ledger (account_id, request_id, kind, amount, free_units, at)
        VALUES (v_account_id, req.id, CASE WHEN p_success THEN 'settle' ELSE 'release' END,
                CASE WHEN p_success THEN req.charged ELSE req.reserved END, v_free, v_now);
        res.outcome := req.status;
      END IF;

      res.account_id := v_account_id;
      res.status := req.status;
      res.funding := req.funding;
      res.reserved := req.reserved;
      res.charged := req.charged;
      res.balance := a.balance;
      res.available := a.balance - a.reserved;
      res.free_remaining := a.free_remaining;
      res.free_available := a.free_remaining - a.free_reserved;
      RETURN res;
    END
    $fn$;

    -- The safety net for accounts that stopped calling: expires stale holds
    -- of up to p_max_accounts accounts. SKIP LOCKED: replicas never wait on
    -- each other or on a busy account (its own next admit expires them).
    CREATE FUNCTION metering_sweep(p_now timestamptz DEFAULT NULL, p_max_accounts integer DEFAULT 1000)
    RETURNS integer LANGUAGE plpgsql AS $fn$
    DECLARE
      v_now timestamptz := coalesce(p_now, clock_timestamp());
      v_total integer := 0;
      v_id uuid;
    BEGIN
      FOR v_id IN
        SELECT a.id FROM accounts a
         WHERE a.id IN (SELECT r.account_id FROM requests r WHERE r.status = 'active' AND r.lease_expires_at <= v_now)
         ORDER BY a.id
         LIMIT p_max_accounts
           FOR UPDATE OF a SKIP LOCKED
      LOOP
        v_total := v_total + metering_expire_account(v_id, v_now);
      END LOOP;
      RETURN v_total;
    END
    $fn$;

    -- Adds credits and free requests with their ledger entries in one
    -- transaction. Returns the updated account, or a row of NULLs if none.
    CREATE FUNCTION metering_grant(
      p_account_id uuid,
      p_units bigint,
      p_free_requests integer,
      p_now timestamptz DEFAULT NULL
    ) RETURNS accounts LANGUAGE plpgsql AS $fn$
    DECLARE
      a accounts%ROWTYPE;
      v_now timestamptz;
    BEGIN
      IF p_units IS NULL OR p_units < 0 OR p_free_requests IS NULL OR p_free_requests < 0 THEN
        RAISE EXCEPTION 'metering_grant: units and free requests must be >= 0' USING ERRCODE = '22023';
      END IF;
      UPDATE accounts
         SET balance = balance + p_units, free_remaining = free_remaining + p_free_requests
       WHERE id = p_account_id
      RETURNING * INTO a;
      IF NOT FOUND THEN
        RETURN a;
      END IF;
      v_now := coalesce(p_now, clock_timestamp());
      IF p_units > 0 THEN
        INSERT INTO ledger (account_id, kind, amount, at) VALUES (p_account_id, 'grant', p_units, v_now);
      END IF;
      IF p_free_requests > 0 THEN
        INSERT INTO ledger (account_id, kind, free_units, at) VALUES (p_account_id, 'free_grant', p_free_requests, v_now);
      END IF;
      RETURN a;
    END
    $fn$;
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    DROP FUNCTION metering_grant(uuid, bigint, integer, timestamptz);
    DROP FUNCTION metering_sweep(timestamptz, integer);
    DROP FUNCTION metering_resolve(uuid, boolean, bigint, jsonb, timestamptz);
    DROP FUNCTION metering_admit(bytea, text, bigint, boolean, integer, text, bytea, timestamptz, uuid);
    DROP FUNCTION metering_expire_account(uuid, timestamptz);
    DROP TYPE metering_resolution;
    DROP TYPE metering_admission;
  `);
}
