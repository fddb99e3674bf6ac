import type { Knex } from "knex";

/**
 * A settle or release records, on its ledger entry, the account as it left
 * it: balance, available balance and free requests. A call whose settle
 * committed but whose reply was lost asks again and finds its request
 * already settled; it then answers with these figures, the account right
 * after its own settle, instead of the account at the time of the retry,
 * which may already include a later call's charge.
 *
 * The figures are written by the INSERT the settle already makes, so the hot
 * path gains no statement; only a resolve that finds its request no longer
 * active reads them back (through the ledger's index on request_id). The
 * columns are plain integers without a domain: every figure is copied from
 * the account row, whose own rules already hold it, and a domain's check
 * would cost each settle for nothing. Adding nullable columns without a
 * default changes only the catalogue, so this runs at once on a large ledger.
 * Entries written before this migration keep NULL, and a resolve that finds
 * one reports the account as it is now, as before.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    ALTER TABLE ledger
      ADD COLUMN balance_after bigint,
      ADD COLUMN available_after bigint,
      ADD COLUMN free_remaining_after integer,
      ADD COLUMN free_available_after integer;

    -- As before, and the settle or release entry records the account as it left it.
    CREATE OR REPLACE FUNCTION metering_resolve(
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
    $fn$;
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE OR REPLACE FUNCTION metering_resolve(
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

    ALTER TABLE ledger
      DROP COLUMN balance_after,
      DROP COLUMN available_after,
      DROP COLUMN free_remaining_after,
      DROP COLUMN free_available_after;
  `);
}
