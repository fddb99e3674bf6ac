import type { SchemaMigration } from "./schema-migration.js";

/**
 * Evaluations: a question set, its labelled examples, and each example's
 * outcome. New tables, one new nullable column (requests.evaluation_id: which
 * evaluation a hold paid for) and two new functions; nothing of the previous
 * release changes.
 *
 * An example's decision is a hold like a call's, with three differences that
 * keep an evaluation out of the API's way: it counts in neither the account's
 * calls in flight nor its rolling minute, it never uses a free request, and its
 * hold has no lease (`infinity`): the sweeper never expires it. The evaluation
 * runner owns it instead: the example row names the hold (`request_id`), and
 * whichever replica takes the example next settles or releases that very hold.
 * The settle and the example's outcome commit in one transaction, so an
 * example is charged exactly once however often its work is retried.
 *
 * - evaluation_admit_example: the hold, under the account's and then the
 *   evaluation's row lock, refused by the evaluation's credit cap or the
 *   account's available balance (`wait` instead while the evaluation's own
 *   holds are out, since they may give money back); admitting an id that
 *   already holds answers `admitted` again and holds nothing more;
 * - evaluation_resolve_example: the settle or release of such a hold, which
 *   also moves it from the evaluation's held units to its charged units.
 */
export const createEvaluations: SchemaMigration = {
  name: "20261128020000_create_evaluations",
  transactional: true,
  async up(db) {
    await db.raw(SQL);
  },
};

const SQL = `
  CREATE TABLE evaluations (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id uuid NOT NULL REFERENCES accounts (id),
    name text NOT NULL DEFAULT '',
    -- Question key -> the question as a decision takes it; question_keys keeps their order.
    questions jsonb NOT NULL,
    question_keys text[] NOT NULL,
    state text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'stopped', 'cancelled', 'finished')),
    stop_reason text NOT NULL DEFAULT '',
    cap_units bigint NOT NULL CHECK (cap_units > 0),
    charged_units bigint NOT NULL DEFAULT 0 CHECK (charged_units >= 0),
    held_units bigint NOT NULL DEFAULT 0 CHECK (held_units >= 0),
    examples_in_flight integer NOT NULL CHECK (examples_in_flight BETWEEN 1 AND 8),
    total integer NOT NULL CHECK (total > 0),
    done integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- When it last started running (created or resumed): the rate's window starts no earlier.
    running_since timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz
  );
  CREATE INDEX evaluations_account ON evaluations (account_id, created_at DESC, id DESC);
  CREATE INDEX evaluations_running ON evaluations (running_since) WHERE state = 'running';

  CREATE TABLE evaluation_examples (
    evaluation_id uuid NOT NULL REFERENCES evaluations (id) ON DELETE CASCADE,
    -- 1-based position in the uploaded set (its line).
    position integer NOT NULL,
    state jsonb NOT NULL,
    -- Question key -> expected answer (true/false, an option name, a label).
    labels jsonb NOT NULL,
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'done', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    -- The hold of the attempt in flight, then the one that finished it.
    request_id uuid,
    -- A replica works on the example until lease_until; another may then take it, and its hold.
    lease_until timestamptz,
    lease_token uuid,
    -- Question key -> the answer as a decision returns it.
    answers jsonb,
    charged_units bigint,
    error text NOT NULL DEFAULT '',
    upstream text,
    prompt_version text,
    finished_at timestamptz,
    PRIMARY KEY (evaluation_id, position)
  );
  CREATE INDEX evaluation_examples_open ON evaluation_examples (evaluation_id, position) WHERE status IN ('pending', 'running');

  CREATE TYPE evaluation_admission AS (outcome text, request_id uuid, reserved bigint, available bigint, cap_left bigint);

  CREATE FUNCTION evaluation_admit_example(p_evaluation_id uuid, p_request_id uuid, p_reserve bigint, p_now timestamptz DEFAULT NULL)
  RETURNS evaluation_admission LANGUAGE plpgsql AS $fn$
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
  $fn$;

  CREATE FUNCTION evaluation_resolve_example(p_request_id uuid, p_success boolean, p_actual bigint, p_now timestamptz DEFAULT NULL)
  RETURNS TABLE (outcome text, charged bigint) LANGUAGE plpgsql AS $fn$
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
  $fn$;
`;
