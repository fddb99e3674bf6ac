import type { Knex } from "knex";

/**
 * Admissions and settles of concurrent calls sent as one statement each
 * (src/db/statement-batcher.ts): one round trip, one transaction and one WAL
 * flush for a batch instead of one per call, so the same PostgreSQL serves
 * many more admit + settle pairs per second under load (`npm run bench:metering`).
 *
 * Each item runs the function a single call runs (metering_admit_unless_abandoned,
 * metering_resolve), with the same rules and outcomes. What a batch adds:
 * - Lock order. An item locks its account's row until the batch commits, so
 *   two batches naming the same two accounts in opposite orders would
 *   deadlock. Items run in the order of their account's id (looked up first,
 *   without a lock), which every batch shares; the single-account functions
 *   (abandon, grant) and the sweep (ordered by id, SKIP LOCKED) keep to it.
 * - All or nothing. An item that raises rolls the whole batch back; the
 *   caller then sends each item alone (createBatcher), so one bad item fails
 *   only its own call. An admission abandoned by its caller raises too: every
 *   item of a batch shares its deadline, so its neighbours were abandoned as well.
 * - Rows come back in the items' order, whatever order they ran in.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE FUNCTION metering_admit_many(
      p_key_hashes bytea[],
      p_endpoints text[],
      p_reserves bigint[],
      p_free_oks boolean[],
      p_lease_ms integer[],
      p_idempotency_keys text[],
      p_request_hashes bytea[],
      p_nows timestamptz[],
      p_request_ids uuid[]
    ) RETURNS SETOF metering_admission LANGUAGE plpgsql AS $fn$
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
    $fn$;

    CREATE FUNCTION metering_resolve_many(
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
        results[i] := metering_resolve(p_request_ids[i], p_successes[i], p_actuals[i], p_responses[i], p_nows[i]);
      END LOOP;
      RETURN QUERY SELECT * FROM unnest(results);
    END
    $fn$;
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    DROP FUNCTION metering_resolve_many(uuid[], boolean[], bigint[], jsonb[], timestamptz[]);
    DROP FUNCTION metering_admit_many(bytea[], text[], bigint[], boolean[], integer[], text[], bytea[], timestamptz[], uuid[]);
  `);
}
