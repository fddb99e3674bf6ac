import type { SchemaMigration } from "./schema-migration.js";

/**
 * The smallest reservation a call makes: a decision of one question
 * (DECISION_RESERVE_UNITS_PER_QUESTION in metering/meter.ts), the same floor
 * as `balance.depleted`. Frozen here as a migration must be; a key-events test
 * checks that the two agree.
 */
const SMALLEST_RESERVATION_UNITS = 32_000;

/**
 * Per-key events. `key.budget_reached` is recorded by the very UPDATE of the
 * key that leaves its budget for the period unable to cover the smallest
 * reservation: the settle's charge (metering_key_charge, unchanged) or a
 * change of its limits. A row trigger sees the key under its row lock, and
 * `budget_reached_in` (the start of the period it was recorded for) makes it
 * once per key and period. A budget that covers the floor again (raised, or a
 * new period's first settle) clears it.
 *
 * The WHEN clause is short, as PostgreSQL prepares it again for each
 * statement, and false for a key without a budget (NULL) or one whose
 * budget still covers a call and was not reached: the function runs only for
 * a key short of its budget or told of it, to record or re-arm. Settles of
 * keys without budgets never update the key at all.
 *
 * `key.expiring` is time-driven (webhooks/key-expiry.ts); `expiry_warned_for`
 * holds the expiry it was recorded for, so a changed expiry warns again.
 *
 * Nullable columns without a default change only the catalogue; the previous
 * release never writes them.
 */
export const recordKeyEvents: SchemaMigration = {
  name: "20261127141000_record_key_events",
  transactional: true,
  async up(trx) {
    await trx.raw(`
      ALTER TABLE api_keys
        ADD COLUMN budget_reached_in timestamptz,
        ADD COLUMN expiry_warned_for timestamptz;

      CREATE FUNCTION api_key_budget_events_v1() RETURNS trigger LANGUAGE plpgsql AS $fn$
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
      $fn$;

      CREATE TRIGGER api_keys_budget_events BEFORE UPDATE ON api_keys FOR EACH ROW
      WHEN (NEW.budget_units - NEW.budget_spent < ${SMALLEST_RESERVATION_UNITS} OR NEW.budget_reached_in IS NOT NULL)
      EXECUTE FUNCTION api_key_budget_events_v1('${SMALLEST_RESERVATION_UNITS}');
    `);
  },
};
