import type { SchemaMigration } from "./schema-migration.js";

/**
 * The balance alerts' trigger, split in two narrower ones that run the same
 * function (account_balance_alerts_v1, unchanged). PostgreSQL parses and
 * compiles a row trigger's WHEN anew in every statement that updates the
 * table, before it tests it: the single trigger's four-arm WHEN made every
 * admission and settle pay that, account alerts or not (docs/performance.md).
 *
 * A column list is tested before the WHEN, from the statement's SET list
 * alone. So an admission, which does not set balance, skips both triggers
 * outright; a settle or release tests one WHEN of two comparisons; a change
 * of the alert settings runs the function, as before.
 *
 * The balance trigger's WHEN drops the direction of the move: it also runs
 * the function when the balance stays or moves the other way while the
 * available balance sits past a level (reservations can put it there). The
 * function takes its branch from the direction itself and records nothing
 * then, and recomputes the same levels. When one statement sets both the
 * balance and the settings, both triggers run it; the second finds the
 * crossings the first recorded and records nothing more.
 *
 * Both triggers are created in the transaction that drops the old one, so no
 * settle commits between them unwatched; only accounts is locked.
 */
export const narrowBalanceAlertTriggers: SchemaMigration = {
  name: "20261127140500_narrow_balance_alert_triggers",
  transactional: true,
  async up(trx) {
    await trx.raw(`
      DROP TRIGGER accounts_balance_alerts ON accounts;

      CREATE TRIGGER accounts_balance_alerts_on_balance BEFORE UPDATE OF balance ON accounts FOR EACH ROW
      WHEN (NEW.balance - NEW.reserved < NEW.alert_low_below OR NEW.balance - NEW.reserved >= NEW.alert_recover_at)
      EXECUTE FUNCTION account_balance_alerts_v1();

      CREATE TRIGGER accounts_balance_alerts_on_settings BEFORE UPDATE OF alert_thresholds, alert_floor ON accounts FOR EACH ROW
      WHEN (NEW.alert_thresholds IS DISTINCT FROM OLD.alert_thresholds OR NEW.alert_floor IS DISTINCT FROM OLD.alert_floor)
      EXECUTE FUNCTION account_balance_alerts_v1();
    `);
  },
};
