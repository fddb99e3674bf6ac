-- The schema of a freshly migrated database (pg_dump --schema-only, normalised).
-- Made by `npm run db:schema`; never edited by hand. CI fails while it differs.

--
-- PostgreSQL database dump
--

--
-- Name: evaluation_admission; Type: TYPE; Schema: public; Owner: -
--

CREATE TYPE public.evaluation_admission AS (
	outcome text,
	request_id uuid,
	reserved bigint,
	available bigint,
	cap_left bigint
);

--
-- Name: metering_admission; Type: TYPE; Schema: public; Owner: -
--

CREATE TYPE public.metering_admission AS (
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

--
-- Name: metering_admission_v2; Type: TYPE; Schema: public; Owner: -
--

CREATE TYPE public.metering_admission_v2 AS (
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
	key_expires_at timestamp with time zone,
	key_budget bigint,
	key_budget_period text,
	key_spent bigint,
	key_held bigint
);

--
-- Name: metering_count; Type: DOMAIN; Schema: public; Owner: -
--

CREATE DOMAIN public.metering_count AS integer
	CONSTRAINT metering_count_not_negative CHECK ((VALUE >= 0));

--
-- Name: metering_endpoint; Type: DOMAIN; Schema: public; Owner: -
--

CREATE DOMAIN public.metering_endpoint AS text
	CONSTRAINT metering_endpoint_known CHECK ((VALUE = ANY (ARRAY['decide'::text, 'search'::text])));

--
-- Name: metering_entry_kind; Type: DOMAIN; Schema: public; Owner: -
--

CREATE DOMAIN public.metering_entry_kind AS text
	CONSTRAINT metering_entry_kind_known CHECK ((VALUE = ANY (ARRAY['grant'::text, 'free_grant'::text, 'hold'::text, 'settle'::text, 'release'::text, 'expire'::text])));

--
-- Name: metering_funding; Type: DOMAIN; Schema: public; Owner: -
--

CREATE DOMAIN public.metering_funding AS text
	CONSTRAINT metering_funding_known CHECK ((VALUE = ANY (ARRAY['free'::text, 'paid'::text])));

--
-- Name: metering_limit; Type: DOMAIN; Schema: public; Owner: -
--

CREATE DOMAIN public.metering_limit AS integer
	CONSTRAINT metering_limit_positive CHECK ((VALUE > 0));

--
-- Name: metering_resolution; Type: TYPE; Schema: public; Owner: -
--

CREATE TYPE public.metering_resolution AS (
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

--
-- Name: metering_status; Type: DOMAIN; Schema: public; Owner: -
--

CREATE DOMAIN public.metering_status AS text
	CONSTRAINT metering_status_known CHECK ((VALUE = ANY (ARRAY['active'::text, 'settled'::text, 'released'::text, 'expired'::text])));

--
-- Name: metering_units; Type: DOMAIN; Schema: public; Owner: -
--

CREATE DOMAIN public.metering_units AS bigint
	CONSTRAINT metering_units_not_negative CHECK ((VALUE >= 0));

--
-- Name: account_balance_alerts_v1(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.account_balance_alerts_v1() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
      DECLARE
        v_available bigint := NEW.balance - NEW.reserved;
        v_thresholds bigint[] := coalesce(NEW.alert_thresholds, '{}');
        v_crossed bigint[];
        v_newly bigint[];
        v_back bigint[];
        v_depleted_ended boolean := false;
        v_threshold bigint;
        v_figures jsonb := jsonb_build_object('balance_units', NEW.balance, 'available_units', NEW.balance - NEW.reserved);
      BEGIN
        -- Thresholds no longer set are no longer crossed.
        SELECT coalesce(array_agg(t ORDER BY t DESC), '{}') INTO v_crossed
          FROM unnest(NEW.alert_crossed) t WHERE t = ANY (v_thresholds);
        IF NEW.alert_floor IS NULL THEN
          NEW.alert_depleted := false;
        END IF;

        IF NEW.balance < OLD.balance
           OR NEW.alert_thresholds IS DISTINCT FROM OLD.alert_thresholds
           OR NEW.alert_floor IS DISTINCT FROM OLD.alert_floor THEN
          SELECT coalesce(array_agg(t ORDER BY t DESC), '{}') INTO v_newly
            FROM unnest(v_thresholds) t WHERE v_available < t AND NOT t = ANY (v_crossed);
          FOREACH v_threshold IN ARRAY v_newly LOOP
            PERFORM account_event_record_v1(NEW.id, 'balance.low', v_figures || jsonb_build_object('threshold_units', v_threshold));
          END LOOP;
          v_crossed := v_crossed || v_newly;
          IF NEW.alert_floor IS NOT NULL AND NOT NEW.alert_depleted AND v_available < NEW.alert_floor THEN
            NEW.alert_depleted := true;
            PERFORM account_event_record_v1(NEW.id, 'balance.depleted', v_figures || jsonb_build_object('smallest_reservation_units', NEW.alert_floor));
          END IF;
        ELSIF NEW.balance > OLD.balance THEN
          SELECT coalesce(array_agg(t ORDER BY t), '{}') INTO v_back FROM unnest(v_crossed) t WHERE v_available >= t;
          v_depleted_ended := NEW.alert_depleted AND v_available >= NEW.alert_floor;
          IF cardinality(v_back) > 0 OR v_depleted_ended THEN
            SELECT coalesce(array_agg(t ORDER BY t DESC), '{}') INTO v_crossed FROM unnest(v_crossed) t WHERE NOT t = ANY (v_back);
            NEW.alert_depleted := NEW.alert_depleted AND NOT v_depleted_ended;
            PERFORM account_event_record_v1(NEW.id, 'balance.recovered',
              v_figures || jsonb_build_object('thresholds_units', to_jsonb(v_back), 'depleted_ended', v_depleted_ended));
          END IF;
        END IF;

        NEW.alert_crossed := v_crossed;
        -- The levels the WHEN clause tests: below the first, a settle runs this; at or above the second, a grant does.
        NEW.alert_low_below := (SELECT max(t) FROM unnest(v_thresholds) t WHERE NOT t = ANY (v_crossed));
        IF NEW.alert_floor IS NOT NULL AND NOT NEW.alert_depleted THEN
          NEW.alert_low_below := greatest(NEW.alert_low_below, NEW.alert_floor);
        END IF;
        NEW.alert_recover_at := (SELECT min(t) FROM unnest(v_crossed) t);
        IF NEW.alert_depleted THEN
          NEW.alert_recover_at := least(NEW.alert_recover_at, NEW.alert_floor);
        END IF;
        RETURN NEW;
      END
      $$;

--
-- Name: account_event_record_v1(uuid, text, jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.account_event_record_v1(p_account_id uuid, p_type text, p_data jsonb) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
      DECLARE
        v_event_id bigint;
      BEGIN
        INSERT INTO account_events (account_id, type, data) VALUES (p_account_id, p_type, p_data) RETURNING id INTO v_event_id;
        INSERT INTO webhook_deliveries (event_id, endpoint_id)
        SELECT v_event_id, e.id FROM webhook_endpoints e
         WHERE e.account_id = p_account_id AND e.enabled AND e.deleted_at IS NULL;
        RETURN v_event_id;
      END
      $$;

--
-- Name: api_key_budget_events_v1(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.api_key_budget_events_v1() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
      DECLARE
        v_floor bigint := TG_ARGV[0]::bigint;
        v_start timestamp;
      BEGIN
        IF NEW.budget_units IS NULL OR NEW.budget_units - NEW.budget_spent >= v_floor THEN
          NEW.budget_reached_in := NULL;
        ELSIF NEW.revoked_at IS NULL AND NEW.budget_period_start IS NOT NULL
              AND NEW.budget_reached_in IS DISTINCT FROM NEW.budget_period_start THEN
          NEW.budget_reached_in := NEW.budget_period_start;
          v_start := CASE WHEN NEW.budget_period <> 'total' THEN NEW.budget_period_start AT TIME ZONE 'UTC' END;
          PERFORM account_event_record_v1(NEW.account_id, 'key.budget_reached', jsonb_build_object(
            'key_id', NEW.id,
            'key_name', NEW.name,
            'key_prefix', NEW.display_prefix,
            'key_last4', NEW.last4,
            'budget_units', NEW.budget_units,
            'spent_units', NEW.budget_spent,
            'left_units', greatest(NEW.budget_units - NEW.budget_spent, 0),
            'period', NEW.budget_period,
            'period_start', to_char(v_start, 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
            'period_end', to_char(v_start + CASE NEW.budget_period WHEN 'day' THEN interval '1 day' WHEN 'week' THEN interval '7 days'
                                                                  ELSE interval '1 month' END, 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
            'smallest_reservation_units', v_floor));
        END IF;
        RETURN NEW;
      END
      $$;

--
-- Name: evaluation_admit_example(uuid, uuid, bigint, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.evaluation_admit_example(p_evaluation_id uuid, p_request_id uuid, p_reserve bigint, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS public.evaluation_admission
    LANGUAGE plpgsql
    AS $$
  DECLARE
    res evaluation_admission;
    a accounts%ROWTYPE;
    e evaluations%ROWTYPE;
    v_account_id uuid;
    v_now timestamptz;
    v_status text;
  BEGIN
    IF p_reserve IS NULL OR p_reserve < 0 THEN
      RAISE EXCEPTION 'evaluation_admit_example: reserve must be >= 0, got %', p_reserve USING ERRCODE = '22023';
    END IF;
    res.request_id := p_request_id;
    SELECT account_id INTO v_account_id FROM evaluations WHERE id = p_evaluation_id;
    IF NOT FOUND THEN
      res.outcome := 'not_found';
      RETURN res;
    END IF;
    SELECT * INTO a FROM accounts WHERE id = v_account_id FOR UPDATE;
    SELECT * INTO e FROM evaluations WHERE id = p_evaluation_id FOR UPDATE;
    v_now := coalesce(p_now, clock_timestamp());
    PERFORM metering_expire_account(a.id, v_now);
    SELECT * INTO a FROM accounts WHERE id = v_account_id;

    SELECT status INTO v_status FROM requests WHERE id = p_request_id;
    IF FOUND THEN
      res.outcome := CASE WHEN v_status = 'active' THEN 'admitted' ELSE 'finished' END;
    -- While the evaluation's own holds are out, a refusal only waits: they may give money back.
    ELSIF e.charged_units + e.held_units + p_reserve > e.cap_units THEN
      res.outcome := CASE WHEN e.held_units > 0 THEN 'wait' ELSE 'credit_cap' END;
    ELSIF a.balance - a.reserved < p_reserve THEN
      res.outcome := CASE WHEN e.held_units > 0 THEN 'wait' ELSE 'insufficient_balance' END;
    ELSE
      UPDATE accounts SET reserved = reserved + p_reserve WHERE id = a.id RETURNING * INTO a;
      INSERT INTO requests (id, account_id, endpoint, funding, reserved, status, created_at, lease_expires_at, evaluation_id)
      VALUES (p_request_id, a.id, 'decide', 'paid', p_reserve, 'active', v_now, 'infinity', e.id);
      INSERT INTO ledger (account_id, request_id, kind, amount, free_units, at)
      VALUES (a.id, p_request_id, 'hold', p_reserve, 0, v_now);
      UPDATE evaluations SET held_units = held_units + p_reserve WHERE id = e.id RETURNING * INTO e;
      res.outcome := 'admitted';
    END IF;
    res.reserved := p_reserve;
    res.available := a.balance - a.reserved;
    res.cap_left := e.cap_units - e.charged_units - e.held_units;
    RETURN res;
  END
  $$;

--
-- Name: evaluation_resolve_example(uuid, boolean, bigint, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.evaluation_resolve_example(p_request_id uuid, p_success boolean, p_actual bigint, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS TABLE(outcome text, charged bigint)
    LANGUAGE plpgsql
    AS $$
  DECLARE
    a accounts%ROWTYPE;
    req requests%ROWTYPE;
    v_now timestamptz;
  BEGIN
    IF p_success IS NULL OR p_actual IS NULL OR p_actual < 0 THEN
      RAISE EXCEPTION 'evaluation_resolve_example: success and a charge >= 0 are required' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO req FROM requests r WHERE r.id = p_request_id AND r.evaluation_id IS NOT NULL;
    IF NOT FOUND THEN
      RETURN QUERY SELECT 'not_found'::text, 0::bigint;
      RETURN;
    END IF;
    PERFORM 1 FROM accounts WHERE id = req.account_id FOR UPDATE;
    PERFORM 1 FROM evaluations WHERE id = req.evaluation_id FOR UPDATE;
    v_now := coalesce(p_now, clock_timestamp());
    UPDATE requests r
       SET status = CASE WHEN p_success THEN 'settled' ELSE 'released' END,
           charged = CASE WHEN p_success THEN least(p_actual, r.reserved) ELSE 0 END,
           resolved_at = v_now
     WHERE r.id = p_request_id AND r.status = 'active'
    RETURNING r.* INTO req;
    IF NOT FOUND THEN
      SELECT * INTO req FROM requests WHERE id = p_request_id;
      RETURN QUERY SELECT 'not_active'::text, req.charged::bigint;
      RETURN;
    END IF;
    UPDATE accounts
       SET reserved = reserved - req.reserved,
           balance = balance - req.charged
     WHERE id = req.account_id
    RETURNING * INTO a;
    INSERT INTO ledger (account_id, request_id, kind, amount, free_units, at,
                        balance_after, available_after, free_remaining_after, free_available_after)
    VALUES (a.id, req.id, CASE WHEN p_success THEN 'settle' ELSE 'release' END,
            CASE WHEN p_success THEN req.charged ELSE req.reserved END, 0, v_now,
            a.balance, a.balance - a.reserved, a.free_remaining, a.free_remaining - a.free_reserved);
    UPDATE evaluations
       SET held_units = held_units - req.reserved, charged_units = charged_units + req.charged
     WHERE id = req.evaluation_id;
    RETURN QUERY SELECT req.status::text, req.charged::bigint;
  END
  $$;

--
-- Name: metering_abandon(uuid, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_abandon(p_request_id uuid, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS public.metering_resolution
    LANGUAGE plpgsql
    AS $$
    DECLARE
      res metering_resolution;
      v_now timestamptz := coalesce(p_now, clock_timestamp());
    BEGIN
      PERFORM metering_admission_lock(p_request_id);
      res := metering_resolve(p_request_id, false, NULL, NULL, p_now);
      IF res.outcome = 'not_found' THEN
        DELETE FROM abandoned_admissions WHERE abandoned_at < v_now - interval '1 day';
        INSERT INTO abandoned_admissions (request_id, abandoned_at) VALUES (p_request_id, v_now)
        ON CONFLICT (request_id) DO NOTHING;
      END IF;
      RETURN res;
    END
    $$;

--
-- Name: metering_admission_lock(uuid); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_admission_lock(p_request_id uuid) RETURNS void
    LANGUAGE sql
    AS $$
      SELECT pg_advisory_xact_lock(hashtext('metering_admission'), hashtext(p_request_id::text));
    $$;

--
-- Name: metering_admit(bytea, text, bigint, boolean, integer, text, bytea, timestamp with time zone, uuid); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_admit(p_key_hash bytea, p_endpoint text, p_reserve bigint, p_free_ok boolean, p_lease_ms integer, p_idempotency_key text DEFAULT NULL::text, p_request_hash bytea DEFAULT NULL::bytea, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone, p_request_id uuid DEFAULT NULL::uuid) RETURNS public.metering_admission
    LANGUAGE plpgsql
    AS $$
    DECLARE
      res metering_admission;
      a accounts%ROWTYPE;
      prior requests%ROWTYPE;
      v_account_id uuid;
      v_key_id uuid;
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

      SELECT k.account_id, k.id INTO v_account_id, v_key_id
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
                                lease_expires_at, idempotency_key, request_hash, key_id)
          VALUES (coalesce(p_request_id, gen_random_uuid()), a.id, p_endpoint, v_funding, v_reserve, 'active', v_now,
                  v_now + make_interval(secs => p_lease_ms / 1000.0), p_idempotency_key, p_request_hash, v_key_id)
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
    $$;

--
-- Name: metering_admit_many(bytea[], text[], bigint[], boolean[], integer[], text[], bytea[], timestamp with time zone[], uuid[]); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_admit_many(p_key_hashes bytea[], p_endpoints text[], p_reserves bigint[], p_free_oks boolean[], p_lease_ms integer[], p_idempotency_keys text[], p_request_hashes bytea[], p_nows timestamp with time zone[], p_request_ids uuid[]) RETURNS SETOF public.metering_admission
    LANGUAGE plpgsql
    AS $$
    DECLARE
      results metering_admission[] := '{}';
      i integer;
    BEGIN
      FOR i IN
        SELECT item.ord FROM unnest(p_key_hashes) WITH ORDINALITY AS item(key_hash, ord)
          LEFT JOIN api_keys k ON k.key_hash = item.key_hash
         ORDER BY k.account_id, item.ord
      LOOP
        results[i] := metering_admit_unless_abandoned(p_key_hashes[i], p_endpoints[i], p_reserves[i], p_free_oks[i],
          p_lease_ms[i], p_idempotency_keys[i], p_request_hashes[i], p_nows[i], p_request_ids[i]);
      END LOOP;
      RETURN QUERY SELECT * FROM unnest(results);
    END
    $$;

--
-- Name: metering_admit_many_v2(bytea[], text[], bigint[], boolean[], integer[], text[], bytea[], timestamp with time zone[], uuid[]); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_admit_many_v2(p_key_hashes bytea[], p_endpoints text[], p_reserves bigint[], p_free_oks boolean[], p_lease_ms integer[], p_idempotency_keys text[], p_request_hashes bytea[], p_nows timestamp with time zone[], p_request_ids uuid[]) RETURNS SETOF public.metering_admission_v2
    LANGUAGE plpgsql
    AS $$
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
  $$;

--
-- Name: metering_admit_unless_abandoned(bytea, text, bigint, boolean, integer, text, bytea, timestamp with time zone, uuid); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_admit_unless_abandoned(p_key_hash bytea, p_endpoint text, p_reserve bigint, p_free_ok boolean, p_lease_ms integer, p_idempotency_key text DEFAULT NULL::text, p_request_hash bytea DEFAULT NULL::bytea, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone, p_request_id uuid DEFAULT NULL::uuid) RETURNS public.metering_admission
    LANGUAGE plpgsql
    AS $$
    DECLARE
      res metering_admission;
    BEGIN
      res := metering_admit(p_key_hash, p_endpoint, p_reserve, p_free_ok, p_lease_ms,
                            p_idempotency_key, p_request_hash, p_now, p_request_id);
      IF res.outcome = 'admitted' AND p_request_id IS NOT NULL THEN
        PERFORM metering_admission_lock(p_request_id);
        IF EXISTS (SELECT 1 FROM abandoned_admissions WHERE request_id = p_request_id) THEN
          RAISE EXCEPTION 'metering_admit: request % was abandoned by its caller; the admission is rolled back', p_request_id;
        END IF;
      END IF;
      RETURN res;
    END
    $$;

--
-- Name: metering_admit_unless_abandoned_v2(bytea, text, bigint, boolean, integer, text, bytea, timestamp with time zone, uuid); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_admit_unless_abandoned_v2(p_key_hash bytea, p_endpoint text, p_reserve bigint, p_free_ok boolean, p_lease_ms integer, p_idempotency_key text DEFAULT NULL::text, p_request_hash bytea DEFAULT NULL::bytea, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone, p_request_id uuid DEFAULT NULL::uuid) RETURNS public.metering_admission_v2
    LANGUAGE plpgsql
    AS $$
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
  $$;

--
-- Name: metering_admit_v2(bytea, text, bigint, boolean, integer, text, bytea, timestamp with time zone, uuid); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_admit_v2(p_key_hash bytea, p_endpoint text, p_reserve bigint, p_free_ok boolean, p_lease_ms integer, p_idempotency_key text DEFAULT NULL::text, p_request_hash bytea DEFAULT NULL::bytea, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone, p_request_id uuid DEFAULT NULL::uuid) RETURNS public.metering_admission_v2
    LANGUAGE plpgsql
    AS $$
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
  $$;

--
-- Name: metering_expire_account(uuid, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_expire_account(p_account_id uuid, p_now timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    AS $$
    BEGIN
      IF EXISTS (SELECT 1 FROM requests r
                  WHERE r.account_id = p_account_id AND r.status = 'active' AND r.lease_expires_at <= p_now) THEN
        RETURN metering_expire_holds(p_account_id, p_now);
      END IF;
      RETURN 0;
    END
    $$;

--
-- Name: metering_expire_holds(uuid, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_expire_holds(p_account_id uuid, p_now timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    AS $$
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
    $$;

--
-- Name: accounts; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.accounts (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    name text DEFAULT ''::text NOT NULL,
    balance public.metering_units DEFAULT 0 NOT NULL,
    reserved public.metering_units DEFAULT 0 NOT NULL,
    free_remaining public.metering_count DEFAULT 0 NOT NULL,
    free_reserved public.metering_count DEFAULT 0 NOT NULL,
    in_flight public.metering_count DEFAULT 0 NOT NULL,
    max_in_flight public.metering_limit DEFAULT 5 NOT NULL,
    rate_limit public.metering_limit DEFAULT 60 NOT NULL,
    rate_window_ms public.metering_limit DEFAULT 60000 NOT NULL,
    recent timestamp with time zone[] DEFAULT '{}'::timestamp with time zone[] NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    alert_thresholds bigint[],
    alert_floor bigint,
    alert_crossed bigint[] DEFAULT '{}'::bigint[] NOT NULL,
    alert_depleted boolean DEFAULT false NOT NULL,
    alert_low_below bigint,
    alert_recover_at bigint,
    CONSTRAINT accounts_check CHECK (((reserved)::bigint <= (balance)::bigint)),
    CONSTRAINT accounts_check1 CHECK (((free_reserved)::integer <= (free_remaining)::integer)),
    CONSTRAINT accounts_check2 CHECK (((in_flight)::integer <= (max_in_flight)::integer))
);

--
-- Name: metering_grant(uuid, bigint, integer, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_grant(p_account_id uuid, p_units bigint, p_free_requests integer, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS public.accounts
    LANGUAGE plpgsql
    AS $$
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
    $$;

--
-- Name: metering_key_charge(uuid, bigint, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_key_charge(p_key_id uuid, p_units bigint, p_now timestamp with time zone) RETURNS void
    LANGUAGE sql
    AS $$
    UPDATE api_keys k
       SET budget_spent = metering_key_spent(k.budget_spent, k.budget_period_start, k.budget_period, p_now) + p_units,
           budget_period_start = metering_key_period_start(k.budget_period, p_now)
     WHERE k.id = p_key_id AND k.budget_units IS NOT NULL;
  $$;

--
-- Name: metering_key_held(uuid, uuid); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_key_held(p_account_id uuid, p_key_id uuid) RETURNS bigint
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(sum(r.reserved), 0)::bigint FROM requests r
     WHERE r.account_id = p_account_id AND r.status = 'active' AND r.key_id = p_key_id;
  $$;

--
-- Name: metering_key_period_start(text, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_key_period_start(p_period text, p_now timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE WHEN p_period = 'total' THEN '-infinity'::timestamptz ELSE date_trunc(p_period, p_now, 'UTC') END;
  $$;

--
-- Name: metering_key_spent(bigint, timestamp with time zone, text, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_key_spent(p_spent bigint, p_period_start timestamp with time zone, p_period text, p_now timestamp with time zone) RETURNS bigint
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE WHEN p_period_start = metering_key_period_start(p_period, p_now) THEN p_spent ELSE 0 END;
  $$;

--
-- Name: metering_resolve(uuid, boolean, bigint, jsonb, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_resolve(p_request_id uuid, p_success boolean, p_actual bigint DEFAULT NULL::bigint, p_response jsonb DEFAULT NULL::jsonb, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS public.metering_resolution
    LANGUAGE plpgsql
    AS $$
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
    $$;

--
-- Name: metering_resolve_many(uuid[], boolean[], bigint[], jsonb[], timestamp with time zone[]); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_resolve_many(p_request_ids uuid[], p_successes boolean[], p_actuals bigint[], p_responses jsonb[], p_nows timestamp with time zone[]) RETURNS SETOF public.metering_resolution
    LANGUAGE plpgsql
    AS $$
    DECLARE
      results metering_resolution[] := '{}';
      i integer;
    BEGIN
      FOR i IN
        SELECT item.ord FROM unnest(p_request_ids) WITH ORDINALITY AS item(id, ord)
          LEFT JOIN requests r ON r.id = item.id
         ORDER BY r.account_id, item.ord
      LOOP
        results[i] := metering_resolve(p_request_ids[i], p_successes[i], p_actuals[i], p_responses[i], p_nows[i]);
      END LOOP;
      RETURN QUERY SELECT * FROM unnest(results);
    END
    $$;

--
-- Name: metering_resolve_many_v2(uuid[], boolean[], bigint[], jsonb[], timestamp with time zone[]); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_resolve_many_v2(p_request_ids uuid[], p_successes boolean[], p_actuals bigint[], p_responses jsonb[], p_nows timestamp with time zone[]) RETURNS SETOF public.metering_resolution
    LANGUAGE plpgsql
    AS $$
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
  $$;

--
-- Name: metering_resolve_v2(uuid, boolean, bigint, jsonb, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_resolve_v2(p_request_id uuid, p_success boolean, p_actual bigint DEFAULT NULL::bigint, p_response jsonb DEFAULT NULL::jsonb, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS public.metering_resolution
    LANGUAGE plpgsql
    AS $$
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
  $$;

--
-- Name: metering_sweep(timestamp with time zone, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.metering_sweep(p_now timestamp with time zone DEFAULT NULL::timestamp with time zone, p_max_accounts integer DEFAULT 1000) RETURNS integer
    LANGUAGE plpgsql
    AS $$
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
    $$;

--
-- Name: abandoned_admissions; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.abandoned_admissions (
    request_id uuid NOT NULL,
    abandoned_at timestamp with time zone NOT NULL
);

--
-- Name: account_activity; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.account_activity (
    id bigint NOT NULL,
    account_id uuid NOT NULL,
    kind text NOT NULL,
    actor text NOT NULL,
    detail text DEFAULT ''::text NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: account_activity_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.account_activity_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: account_activity_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.account_activity_id_seq OWNED BY public.account_activity.id;

--
-- Name: account_events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.account_events (
    id bigint NOT NULL,
    account_id uuid NOT NULL,
    webhook_id text DEFAULT ('msg_'::text || replace((gen_random_uuid())::text, '-'::text, ''::text)) NOT NULL,
    type text NOT NULL,
    data jsonb NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);

--
-- Name: account_events_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.account_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: account_events_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.account_events_id_seq OWNED BY public.account_events.id;

--
-- Name: account_settings; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.account_settings (
    account_id uuid NOT NULL,
    require_two_factor boolean DEFAULT false NOT NULL
);

--
-- Name: api_keys; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.api_keys (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    account_id uuid NOT NULL,
    key_hash bytea NOT NULL,
    display_prefix text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    revoked_at timestamp with time zone,
    name text DEFAULT ''::text NOT NULL,
    last4 text DEFAULT ''::text NOT NULL,
    created_by text DEFAULT 'operator'::text NOT NULL,
    expires_at timestamp with time zone,
    scopes text[],
    budget_units bigint,
    budget_period text,
    rate_limit integer,
    budget_spent bigint DEFAULT 0 NOT NULL,
    budget_period_start timestamp with time zone,
    recent timestamp with time zone[] DEFAULT '{}'::timestamp with time zone[] NOT NULL,
    kept_by text,
    kept_at timestamp with time zone,
    budget_reached_in timestamp with time zone,
    expiry_warned_for timestamp with time zone
);

--
-- Name: calibrations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.calibrations (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    account_id uuid NOT NULL,
    evaluation_id uuid NOT NULL,
    question_key text NOT NULL,
    method text NOT NULL,
    question_type text NOT NULL,
    instructions text NOT NULL,
    labels text[] NOT NULL,
    prompt_version text NOT NULL,
    model text NOT NULL,
    upstream text NOT NULL,
    signature text NOT NULL,
    version integer NOT NULL,
    parameters jsonb NOT NULL,
    held_out jsonb NOT NULL,
    created_by text NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT calibrations_method_check CHECK ((method = ANY (ARRAY['platt'::text, 'isotonic'::text, 'temperature'::text, 'vector'::text, 'contextual'::text]))),
    CONSTRAINT calibrations_question_type_check CHECK ((question_type = ANY (ARRAY['noul'::text, 'choice'::text, 'score'::text]))),
    CONSTRAINT calibrations_version_check CHECK ((version > 0))
);

--
-- Name: evaluation_examples; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.evaluation_examples (
    evaluation_id uuid NOT NULL,
    "position" integer NOT NULL,
    state jsonb NOT NULL,
    labels jsonb NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    request_id uuid,
    lease_until timestamp with time zone,
    lease_token uuid,
    answers jsonb,
    charged_units bigint,
    error text DEFAULT ''::text NOT NULL,
    upstream text,
    prompt_version text,
    finished_at timestamp with time zone,
    CONSTRAINT evaluation_examples_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'running'::text, 'done'::text, 'failed'::text])))
);

--
-- Name: evaluations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.evaluations (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    account_id uuid NOT NULL,
    name text DEFAULT ''::text NOT NULL,
    questions jsonb NOT NULL,
    question_keys text[] NOT NULL,
    state text DEFAULT 'running'::text NOT NULL,
    stop_reason text DEFAULT ''::text NOT NULL,
    cap_units bigint NOT NULL,
    charged_units bigint DEFAULT 0 NOT NULL,
    held_units bigint DEFAULT 0 NOT NULL,
    examples_in_flight integer NOT NULL,
    total integer NOT NULL,
    done integer DEFAULT 0 NOT NULL,
    failed integer DEFAULT 0 NOT NULL,
    created_by text NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    running_since timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT evaluations_cap_units_check CHECK ((cap_units > 0)),
    CONSTRAINT evaluations_charged_units_check CHECK ((charged_units >= 0)),
    CONSTRAINT evaluations_examples_in_flight_check CHECK (((examples_in_flight >= 1) AND (examples_in_flight <= 8))),
    CONSTRAINT evaluations_held_units_check CHECK ((held_units >= 0)),
    CONSTRAINT evaluations_state_check CHECK ((state = ANY (ARRAY['running'::text, 'stopped'::text, 'cancelled'::text, 'finished'::text]))),
    CONSTRAINT evaluations_total_check CHECK ((total > 0))
);

--
-- Name: knex_migrations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.knex_migrations (
    id integer NOT NULL,
    name character varying(255),
    batch integer,
    migration_time timestamp with time zone
);

--
-- Name: knex_migrations_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.knex_migrations_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: knex_migrations_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.knex_migrations_id_seq OWNED BY public.knex_migrations.id;

--
-- Name: knex_migrations_lock; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.knex_migrations_lock (
    index integer NOT NULL,
    is_locked integer
);

--
-- Name: knex_migrations_lock_index_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.knex_migrations_lock_index_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: knex_migrations_lock_index_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.knex_migrations_lock_index_seq OWNED BY public.knex_migrations_lock.index;

--
-- Name: ledger; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.ledger (
    id bigint NOT NULL,
    account_id uuid NOT NULL,
    request_id uuid,
    kind public.metering_entry_kind NOT NULL,
    amount public.metering_units DEFAULT 0 NOT NULL,
    free_units public.metering_count DEFAULT 0 NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    balance_after bigint,
    available_after bigint,
    free_remaining_after integer,
    free_available_after integer,
    CONSTRAINT ledger_check CHECK ((((kind)::text = ANY (ARRAY['grant'::text, 'free_grant'::text])) = (request_id IS NULL)))
);

--
-- Name: ledger_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.ledger_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: ledger_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.ledger_id_seq OWNED BY public.ledger.id;

--
-- Name: member_invites; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.member_invites (
    token_hash bytea NOT NULL,
    member_id uuid NOT NULL,
    created_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    used_at timestamp with time zone
);

--
-- Name: member_recovery_codes; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.member_recovery_codes (
    id bigint NOT NULL,
    member_id uuid NOT NULL,
    code_hash bytea NOT NULL,
    used_at timestamp with time zone
);

--
-- Name: member_recovery_codes_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.member_recovery_codes_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: member_recovery_codes_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.member_recovery_codes_id_seq OWNED BY public.member_recovery_codes.id;

--
-- Name: member_sessions; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.member_sessions (
    token_hash bytea NOT NULL,
    member_id uuid NOT NULL,
    created_at timestamp with time zone NOT NULL,
    last_seen_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    ended_at timestamp with time zone
);

--
-- Name: members; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.members (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    account_id uuid NOT NULL,
    email text NOT NULL,
    password_hash text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    removed_at timestamp with time zone,
    role text DEFAULT 'member'::text NOT NULL,
    totp_secret text,
    totp_pending_secret text,
    totp_enabled_at timestamp with time zone,
    totp_last_step bigint,
    CONSTRAINT members_email_check CHECK (((email = lower(email)) AND (email <> ''::text))),
    CONSTRAINT members_role_check CHECK ((role = ANY (ARRAY['owner'::text, 'admin'::text, 'member'::text, 'viewer'::text])))
);

--
-- Name: requests; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.requests (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    account_id uuid NOT NULL,
    endpoint public.metering_endpoint NOT NULL,
    funding public.metering_funding NOT NULL,
    reserved public.metering_units NOT NULL,
    charged public.metering_units DEFAULT 0 NOT NULL,
    status public.metering_status DEFAULT 'active'::text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    lease_expires_at timestamp with time zone NOT NULL,
    resolved_at timestamp with time zone,
    idempotency_key text,
    request_hash bytea,
    response jsonb,
    key_id uuid,
    evaluation_id uuid,
    CONSTRAINT requests_check CHECK (((charged)::bigint <= (reserved)::bigint)),
    CONSTRAINT requests_check1 CHECK ((((funding)::text = 'paid'::text) OR ((reserved)::bigint = 0)))
);

--
-- Name: schema_migrations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.schema_migrations (
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL,
    applied_by text NOT NULL,
    served_from text
);

--
-- Name: sign_in_attempts; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.sign_in_attempts (
    id bigint NOT NULL,
    email text NOT NULL,
    at timestamp with time zone NOT NULL
);

--
-- Name: sign_in_attempts_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.sign_in_attempts_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: sign_in_attempts_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.sign_in_attempts_id_seq OWNED BY public.sign_in_attempts.id;

--
-- Name: sign_in_challenges; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.sign_in_challenges (
    token_hash bytea NOT NULL,
    member_id uuid NOT NULL,
    created_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    used_at timestamp with time zone
);

--
-- Name: usage_daily; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.usage_daily (
    account_id uuid NOT NULL,
    day timestamp with time zone NOT NULL,
    endpoint text NOT NULL,
    key_id uuid,
    calls bigint NOT NULL,
    charged bigint NOT NULL
);

--
-- Name: usage_hourly; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.usage_hourly (
    account_id uuid NOT NULL,
    hour timestamp with time zone NOT NULL,
    endpoint text NOT NULL,
    key_id uuid,
    calls bigint NOT NULL,
    charged bigint NOT NULL
);

--
-- Name: usage_rollup_state; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.usage_rollup_state (
    id boolean DEFAULT true NOT NULL,
    rolled_until timestamp with time zone,
    CONSTRAINT usage_rollup_state_id_check CHECK (id)
);

--
-- Name: webhook_attempts; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.webhook_attempts (
    id bigint NOT NULL,
    delivery_id bigint NOT NULL,
    attempt integer NOT NULL,
    at timestamp with time zone NOT NULL,
    status integer,
    latency_ms integer NOT NULL,
    error text DEFAULT ''::text NOT NULL
);

--
-- Name: webhook_attempts_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.webhook_attempts_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: webhook_attempts_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.webhook_attempts_id_seq OWNED BY public.webhook_attempts.id;

--
-- Name: webhook_deliveries; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.webhook_deliveries (
    id bigint NOT NULL,
    event_id bigint NOT NULL,
    endpoint_id uuid NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    replayed_after integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    lease_until timestamp with time zone,
    lease_token uuid,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT webhook_deliveries_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'delivered'::text, 'failed'::text])))
);

--
-- Name: webhook_deliveries_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.webhook_deliveries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: webhook_deliveries_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.webhook_deliveries_id_seq OWNED BY public.webhook_deliveries.id;

--
-- Name: webhook_endpoints; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.webhook_endpoints (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    account_id uuid NOT NULL,
    url text NOT NULL,
    secret text NOT NULL,
    previous_secret text,
    previous_secret_until timestamp with time zone,
    enabled boolean DEFAULT true NOT NULL,
    disabled_reason text DEFAULT ''::text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    deleted_at timestamp with time zone
);

--
-- Name: account_activity id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.account_activity ALTER COLUMN id SET DEFAULT nextval('public.account_activity_id_seq'::regclass);

--
-- Name: account_events id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.account_events ALTER COLUMN id SET DEFAULT nextval('public.account_events_id_seq'::regclass);

--
-- Name: knex_migrations id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.knex_migrations ALTER COLUMN id SET DEFAULT nextval('public.knex_migrations_id_seq'::regclass);

--
-- Name: knex_migrations_lock index; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.knex_migrations_lock ALTER COLUMN index SET DEFAULT nextval('public.knex_migrations_lock_index_seq'::regclass);

--
-- Name: ledger id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger ALTER COLUMN id SET DEFAULT nextval('public.ledger_id_seq'::regclass);

--
-- Name: member_recovery_codes id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.member_recovery_codes ALTER COLUMN id SET DEFAULT nextval('public.member_recovery_codes_id_seq'::regclass);

--
-- Name: sign_in_attempts id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.sign_in_attempts ALTER COLUMN id SET DEFAULT nextval('public.sign_in_attempts_id_seq'::regclass);

--
-- Name: webhook_attempts id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.webhook_attempts ALTER COLUMN id SET DEFAULT nextval('public.webhook_attempts_id_seq'::regclass);

--
-- Name: webhook_deliveries id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.webhook_deliveries ALTER COLUMN id SET DEFAULT nextval('public.webhook_deliveries_id_seq'::regclass);

--
-- Name: abandoned_admissions abandoned_admissions_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.abandoned_admissions
    ADD CONSTRAINT abandoned_admissions_pkey PRIMARY KEY (request_id);

--
-- Name: account_activity account_activity_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.account_activity
    ADD CONSTRAINT account_activity_pkey PRIMARY KEY (id);

--
-- Name: account_events account_events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.account_events
    ADD CONSTRAINT account_events_pkey PRIMARY KEY (id);

--
-- Name: account_events account_events_webhook_id_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.account_events
    ADD CONSTRAINT account_events_webhook_id_key UNIQUE (webhook_id);

--
-- Name: account_settings account_settings_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.account_settings
    ADD CONSTRAINT account_settings_pkey PRIMARY KEY (account_id);

--
-- Name: accounts accounts_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.accounts
    ADD CONSTRAINT accounts_pkey PRIMARY KEY (id);

--
-- Name: api_keys api_keys_budget_has_period; Type: CHECK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE public.api_keys
    ADD CONSTRAINT api_keys_budget_has_period CHECK (((budget_units IS NULL) = (budget_period IS NULL))) NOT VALID;

--
-- Name: api_keys api_keys_budget_not_negative; Type: CHECK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE public.api_keys
    ADD CONSTRAINT api_keys_budget_not_negative CHECK ((budget_units >= 0)) NOT VALID;

--
-- Name: api_keys api_keys_budget_period_known; Type: CHECK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE public.api_keys
    ADD CONSTRAINT api_keys_budget_period_known CHECK ((budget_period = ANY (ARRAY['day'::text, 'week'::text, 'month'::text, 'total'::text]))) NOT VALID;

--
-- Name: api_keys api_keys_budget_spent_not_negative; Type: CHECK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE public.api_keys
    ADD CONSTRAINT api_keys_budget_spent_not_negative CHECK ((budget_spent >= 0)) NOT VALID;

--
-- Name: api_keys api_keys_key_hash_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.api_keys
    ADD CONSTRAINT api_keys_key_hash_key UNIQUE (key_hash);

--
-- Name: api_keys api_keys_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.api_keys
    ADD CONSTRAINT api_keys_pkey PRIMARY KEY (id);

--
-- Name: api_keys api_keys_rate_limit_positive; Type: CHECK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE public.api_keys
    ADD CONSTRAINT api_keys_rate_limit_positive CHECK ((rate_limit > 0)) NOT VALID;

--
-- Name: api_keys api_keys_scopes_known; Type: CHECK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE public.api_keys
    ADD CONSTRAINT api_keys_scopes_known CHECK (((scopes <@ ARRAY['decisions'::text, 'search'::text]) AND (cardinality(scopes) > 0))) NOT VALID;

--
-- Name: calibrations calibrations_account_id_signature_version_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.calibrations
    ADD CONSTRAINT calibrations_account_id_signature_version_key UNIQUE (account_id, signature, version);

--
-- Name: calibrations calibrations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.calibrations
    ADD CONSTRAINT calibrations_pkey PRIMARY KEY (id);

--
-- Name: evaluation_examples evaluation_examples_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.evaluation_examples
    ADD CONSTRAINT evaluation_examples_pkey PRIMARY KEY (evaluation_id, "position");

--
-- Name: evaluations evaluations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.evaluations
    ADD CONSTRAINT evaluations_pkey PRIMARY KEY (id);

--
-- Name: knex_migrations_lock knex_migrations_lock_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.knex_migrations_lock
    ADD CONSTRAINT knex_migrations_lock_pkey PRIMARY KEY (index);

--
-- Name: knex_migrations knex_migrations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.knex_migrations
    ADD CONSTRAINT knex_migrations_pkey PRIMARY KEY (id);

--
-- Name: ledger ledger_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger
    ADD CONSTRAINT ledger_pkey PRIMARY KEY (id);

--
-- Name: member_invites member_invites_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.member_invites
    ADD CONSTRAINT member_invites_pkey PRIMARY KEY (token_hash);

--
-- Name: member_recovery_codes member_recovery_codes_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.member_recovery_codes
    ADD CONSTRAINT member_recovery_codes_pkey PRIMARY KEY (id);

--
-- Name: member_sessions member_sessions_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.member_sessions
    ADD CONSTRAINT member_sessions_pkey PRIMARY KEY (token_hash);

--
-- Name: members members_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.members
    ADD CONSTRAINT members_pkey PRIMARY KEY (id);

--
-- Name: requests requests_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.requests
    ADD CONSTRAINT requests_pkey PRIMARY KEY (id);

--
-- Name: schema_migrations schema_migrations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (name);

--
-- Name: sign_in_attempts sign_in_attempts_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.sign_in_attempts
    ADD CONSTRAINT sign_in_attempts_pkey PRIMARY KEY (id);

--
-- Name: sign_in_challenges sign_in_challenges_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.sign_in_challenges
    ADD CONSTRAINT sign_in_challenges_pkey PRIMARY KEY (token_hash);

--
-- Name: usage_rollup_state usage_rollup_state_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.usage_rollup_state
    ADD CONSTRAINT usage_rollup_state_pkey PRIMARY KEY (id);

--
-- Name: webhook_attempts webhook_attempts_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.webhook_attempts
    ADD CONSTRAINT webhook_attempts_pkey PRIMARY KEY (id);

--
-- Name: webhook_deliveries webhook_deliveries_event_id_endpoint_id_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_event_id_endpoint_id_key UNIQUE (event_id, endpoint_id);

--
-- Name: webhook_deliveries webhook_deliveries_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (id);

--
-- Name: webhook_endpoints webhook_endpoints_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.webhook_endpoints
    ADD CONSTRAINT webhook_endpoints_pkey PRIMARY KEY (id);

--
-- Name: account_activity_account_at; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX account_activity_account_at ON public.account_activity USING btree (account_id, at, id);

--
-- Name: account_events_account; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX account_events_account ON public.account_events USING btree (account_id, id);

--
-- Name: api_keys_account_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX api_keys_account_id ON public.api_keys USING btree (account_id);

--
-- Name: api_keys_expiring; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX api_keys_expiring ON public.api_keys USING btree (expires_at) WHERE ((expires_at IS NOT NULL) AND (revoked_at IS NULL));

--
-- Name: calibrations_account; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX calibrations_account ON public.calibrations USING btree (account_id, created_at DESC, id DESC);

--
-- Name: evaluation_examples_open; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX evaluation_examples_open ON public.evaluation_examples USING btree (evaluation_id, "position") WHERE (status = ANY (ARRAY['pending'::text, 'running'::text]));

--
-- Name: evaluations_account; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX evaluations_account ON public.evaluations USING btree (account_id, created_at DESC, id DESC);

--
-- Name: evaluations_running; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX evaluations_running ON public.evaluations USING btree (running_since) WHERE (state = 'running'::text);

--
-- Name: ledger_account_at; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ledger_account_at ON public.ledger USING btree (account_id, at);

--
-- Name: ledger_request_once; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX ledger_request_once ON public.ledger USING btree (request_id, (((kind)::text = 'hold'::text))) WHERE (request_id IS NOT NULL);

--
-- Name: member_invites_member; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX member_invites_member ON public.member_invites USING btree (member_id);

--
-- Name: member_recovery_codes_member; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX member_recovery_codes_member ON public.member_recovery_codes USING btree (member_id) WHERE (used_at IS NULL);

--
-- Name: member_sessions_member; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX member_sessions_member ON public.member_sessions USING btree (member_id) WHERE (ended_at IS NULL);

--
-- Name: members_account; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX members_account ON public.members USING btree (account_id);

--
-- Name: members_live_email; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX members_live_email ON public.members USING btree (email) WHERE (removed_at IS NULL);

--
-- Name: requests_account_created; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX requests_account_created ON public.requests USING btree (account_id, created_at);

--
-- Name: requests_active_account; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX requests_active_account ON public.requests USING btree (account_id) WHERE ((status)::text = 'active'::text);

--
-- Name: requests_active_lease; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX requests_active_lease ON public.requests USING btree (lease_expires_at) WHERE ((status)::text = 'active'::text);

--
-- Name: requests_created_brin; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX requests_created_brin ON public.requests USING brin (created_at) WITH (autosummarize='on');

--
-- Name: requests_evaluation; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX requests_evaluation ON public.requests USING btree (evaluation_id) WHERE (evaluation_id IS NOT NULL);

--
-- Name: requests_idempotency; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX requests_idempotency ON public.requests USING btree (account_id, idempotency_key) WHERE ((idempotency_key IS NOT NULL) AND ((status)::text = ANY (ARRAY['active'::text, 'settled'::text])));

--
-- Name: requests_key_created; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX requests_key_created ON public.requests USING btree (key_id, created_at) WHERE (key_id IS NOT NULL);

--
-- Name: sign_in_attempts_email_at; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX sign_in_attempts_email_at ON public.sign_in_attempts USING btree (email, at);

--
-- Name: sign_in_challenges_member; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX sign_in_challenges_member ON public.sign_in_challenges USING btree (member_id) WHERE (used_at IS NULL);

--
-- Name: usage_daily_bucket; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX usage_daily_bucket ON public.usage_daily USING btree (account_id, day, endpoint, COALESCE(key_id, '00000000-0000-0000-0000-000000000000'::uuid));

--
-- Name: usage_hourly_bucket; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX usage_hourly_bucket ON public.usage_hourly USING btree (account_id, hour, endpoint, COALESCE(key_id, '00000000-0000-0000-0000-000000000000'::uuid));

--
-- Name: webhook_attempts_delivery; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX webhook_attempts_delivery ON public.webhook_attempts USING btree (delivery_id, id);

--
-- Name: webhook_deliveries_due; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX webhook_deliveries_due ON public.webhook_deliveries USING btree (next_attempt_at) WHERE (state = 'pending'::text);

--
-- Name: webhook_deliveries_pending; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX webhook_deliveries_pending ON public.webhook_deliveries USING btree (endpoint_id, id) WHERE (state = 'pending'::text);

--
-- Name: webhook_endpoints_account; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX webhook_endpoints_account ON public.webhook_endpoints USING btree (account_id) WHERE (deleted_at IS NULL);

--
-- Name: accounts accounts_balance_alerts_on_balance; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER accounts_balance_alerts_on_balance BEFORE UPDATE OF balance ON public.accounts FOR EACH ROW WHEN (((((new.balance)::bigint - (new.reserved)::bigint) < new.alert_low_below) OR (((new.balance)::bigint - (new.reserved)::bigint) >= new.alert_recover_at))) EXECUTE FUNCTION public.account_balance_alerts_v1();

--
-- Name: accounts accounts_balance_alerts_on_settings; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER accounts_balance_alerts_on_settings BEFORE UPDATE OF alert_thresholds, alert_floor ON public.accounts FOR EACH ROW WHEN (((new.alert_thresholds IS DISTINCT FROM old.alert_thresholds) OR (new.alert_floor IS DISTINCT FROM old.alert_floor))) EXECUTE FUNCTION public.account_balance_alerts_v1();

--
-- Name: api_keys api_keys_budget_events; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER api_keys_budget_events BEFORE UPDATE ON public.api_keys FOR EACH ROW WHEN ((((new.budget_units - new.budget_spent) < 32000) OR (new.budget_reached_in IS NOT NULL))) EXECUTE FUNCTION public.api_key_budget_events_v1('32000');

--
-- Name: account_activity account_activity_account_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.account_activity
    ADD CONSTRAINT account_activity_account_id_fkey FOREIGN KEY (account_id) REFERENCES public.accounts(id);

--
-- Name: account_events account_events_account_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.account_events
    ADD CONSTRAINT account_events_account_id_fkey FOREIGN KEY (account_id) REFERENCES public.accounts(id);

--
-- Name: api_keys api_keys_account_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.api_keys
    ADD CONSTRAINT api_keys_account_id_fkey FOREIGN KEY (account_id) REFERENCES public.accounts(id);

--
-- Name: calibrations calibrations_account_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.calibrations
    ADD CONSTRAINT calibrations_account_id_fkey FOREIGN KEY (account_id) REFERENCES public.accounts(id);

--
-- Name: evaluation_examples evaluation_examples_evaluation_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.evaluation_examples
    ADD CONSTRAINT evaluation_examples_evaluation_id_fkey FOREIGN KEY (evaluation_id) REFERENCES public.evaluations(id) ON DELETE CASCADE;

--
-- Name: evaluations evaluations_account_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.evaluations
    ADD CONSTRAINT evaluations_account_id_fkey FOREIGN KEY (account_id) REFERENCES public.accounts(id);

--
-- Name: ledger ledger_account_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger
    ADD CONSTRAINT ledger_account_id_fkey FOREIGN KEY (account_id) REFERENCES public.accounts(id);

--
-- Name: ledger ledger_request_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.ledger
    ADD CONSTRAINT ledger_request_id_fkey FOREIGN KEY (request_id) REFERENCES public.requests(id);

--
-- Name: member_invites member_invites_member_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.member_invites
    ADD CONSTRAINT member_invites_member_id_fkey FOREIGN KEY (member_id) REFERENCES public.members(id);

--
-- Name: member_recovery_codes member_recovery_codes_member_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.member_recovery_codes
    ADD CONSTRAINT member_recovery_codes_member_id_fkey FOREIGN KEY (member_id) REFERENCES public.members(id);

--
-- Name: member_sessions member_sessions_member_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.member_sessions
    ADD CONSTRAINT member_sessions_member_id_fkey FOREIGN KEY (member_id) REFERENCES public.members(id);

--
-- Name: members members_account_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.members
    ADD CONSTRAINT members_account_id_fkey FOREIGN KEY (account_id) REFERENCES public.accounts(id);

--
-- Name: requests requests_account_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.requests
    ADD CONSTRAINT requests_account_id_fkey FOREIGN KEY (account_id) REFERENCES public.accounts(id);

--
-- Name: sign_in_challenges sign_in_challenges_member_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.sign_in_challenges
    ADD CONSTRAINT sign_in_challenges_member_id_fkey FOREIGN KEY (member_id) REFERENCES public.members(id);

--
-- Name: webhook_attempts webhook_attempts_delivery_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.webhook_attempts
    ADD CONSTRAINT webhook_attempts_delivery_id_fkey FOREIGN KEY (delivery_id) REFERENCES public.webhook_deliveries(id);

--
-- Name: webhook_deliveries webhook_deliveries_endpoint_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_endpoint_id_fkey FOREIGN KEY (endpoint_id) REFERENCES public.webhook_endpoints(id);

--
-- Name: webhook_deliveries webhook_deliveries_event_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_event_id_fkey FOREIGN KEY (event_id) REFERENCES public.account_events(id);

--
-- Name: webhook_endpoints webhook_endpoints_account_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.webhook_endpoints
    ADD CONSTRAINT webhook_endpoints_account_id_fkey FOREIGN KEY (account_id) REFERENCES public.accounts(id);

--
-- PostgreSQL database dump complete
--
