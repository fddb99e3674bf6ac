import type { Knex } from "knex";

/**
 * An admission whose reply did not come in time must not hold credits and a
 * concurrency slot after its call gave up. The meter then abandons the
 * request id: metering_abandon releases the hold if the admission committed,
 * and otherwise records the id, so that an admission still on its way (slowed
 * past its deadline by a busy server or a lock) rolls itself back instead of
 * holding until its lease. Before this, such a hold took one of the account's
 * in-flight slots for the whole lease (a seeded fault test saw a later call
 * refused CONCURRENCY_LIMITED).
 *
 * The two sides meet on a transaction-level advisory lock keyed by the
 * request id. An admission takes it after metering_admit, so it already holds
 * its account's row and an abandon never waits behind a slow admission that
 * has not written yet; an abandon takes it before it looks the request up. So
 * either the admission commits first and the abandon, let through only after
 * that commit, finds and releases its hold, or the abandon commits first and
 * the admission, let through after it, finds the record and rolls back.
 * metering_admit and metering_resolve are used as they are.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE TABLE abandoned_admissions (
      request_id uuid PRIMARY KEY,
      abandoned_at timestamptz NOT NULL
    );

    -- The advisory lock's first key: its own space, apart from any other lock of the schema.
    CREATE FUNCTION metering_admission_lock(p_request_id uuid) RETURNS void LANGUAGE sql AS $fn$
      SELECT pg_advisory_xact_lock(hashtext('metering_admission'), hashtext(p_request_id::text));
    $fn$;

    -- metering_admit, refused (by an exception, which rolls the admission
    -- back) when the caller has already abandoned the request id.
    CREATE FUNCTION metering_admit_unless_abandoned(
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
    $fn$;

    -- Gives up on an admission whose reply never came: releases its hold if it
    -- committed (as metering_resolve with success false), else records the id
    -- so that the admission refuses itself if it still arrives. Records older
    -- than a day are dropped as a new one is written: no admission is that late.
    CREATE FUNCTION metering_abandon(p_request_id uuid, p_now timestamptz DEFAULT NULL)
    RETURNS metering_resolution LANGUAGE plpgsql AS $fn$
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
    $fn$;
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    DROP FUNCTION metering_abandon(uuid, timestamptz);
    DROP FUNCTION metering_admit_unless_abandoned(bytea, text, bigint, boolean, integer, text, bytea, timestamptz, uuid);
    DROP FUNCTION metering_admission_lock(uuid);
    DROP TABLE abandoned_admissions;
  `);
}
