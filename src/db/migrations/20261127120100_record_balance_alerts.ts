import type { SchemaMigration } from "./schema-migration.js";

/**
 * Balance alerts, recorded by the very UPDATE of the account that causes
 * them: a settle or a grant (whose functions stay as they are) or a change of
 * the account's alert settings. A row trigger on accounts sees the row under
 * its lock, so concurrent calls, replicas or a crash can neither miss a
 * crossing nor record it twice: the crossed state lives in the same row.
 *
 * The hot path pays one WHEN test per UPDATE of an account: two precomputed
 * levels (`alert_low_below`, `alert_recover_at`) are NULL for an account
 * without alerts, and for one with alerts the trigger's function runs only
 * when the balance moves across a level. Admissions and releases leave the
 * balance as it is and never run it. Money is in units, as everywhere.
 *
 * The columns are nullable or have a constant default, so adding them only
 * changes the catalogue; the previous release never writes them.
 */
export const recordBalanceAlerts: SchemaMigration = {
  name: "20261127120100_record_balance_alerts",
  transactional: true,
  async up(db) {
    await db.raw(`
      ALTER TABLE accounts
        ADD COLUMN alert_thresholds bigint[],
        ADD COLUMN alert_floor bigint,
        ADD COLUMN alert_crossed bigint[] NOT NULL DEFAULT '{}',
        ADD COLUMN alert_depleted boolean NOT NULL DEFAULT false,
        ADD COLUMN alert_low_below bigint,
        ADD COLUMN alert_recover_at bigint;

      -- Records one event and a pending delivery to each enabled endpoint of the account.
      CREATE FUNCTION account_event_record_v1(p_account_id uuid, p_type text, p_data jsonb) RETURNS bigint
      LANGUAGE plpgsql AS $fn$
      DECLARE
        v_event_id bigint;
      BEGIN
        INSERT INTO account_events (account_id, type, data) VALUES (p_account_id, p_type, p_data) RETURNING id INTO v_event_id;
        INSERT INTO webhook_deliveries (event_id, endpoint_id)
        SELECT v_event_id, e.id FROM webhook_endpoints e
         WHERE e.account_id = p_account_id AND e.enabled AND e.deleted_at IS NULL;
        RETURN v_event_id;
      END
      $fn$;

      CREATE FUNCTION account_balance_alerts_v1() RETURNS trigger LANGUAGE plpgsql AS $fn$
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
      $fn$;

      CREATE TRIGGER accounts_balance_alerts BEFORE UPDATE ON accounts FOR EACH ROW
      WHEN (
        (NEW.balance < OLD.balance AND NEW.balance - NEW.reserved < NEW.alert_low_below)
        OR (NEW.balance > OLD.balance AND NEW.balance - NEW.reserved >= NEW.alert_recover_at)
        OR NEW.alert_thresholds IS DISTINCT FROM OLD.alert_thresholds
        OR NEW.alert_floor IS DISTINCT FROM OLD.alert_floor
      )
      EXECUTE FUNCTION account_balance_alerts_v1();
    `);
  },
};
