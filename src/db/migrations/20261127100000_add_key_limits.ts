import type { Knex } from "knex";
import type { SchemaMigration } from "./schema-migration.js";

/**
 * What a key may do, set by its owner: an expiry, scopes (the endpoints it
 * may call), a budget of units per period and a rate limit. Each is NULL for
 * "no limit", so every existing key keeps working as before, and a key with
 * no limit costs the admission no extra write.
 *
 * The key's own counters live on its row, written under its account's row
 * lock (every metering function takes that lock first): the units its calls
 * were charged in the budget period that starts at `budget_period_start`, and
 * the times of its admissions in the rolling minute. What its calls hold now
 * is not kept here: it is summed from its active requests (the account's
 * active-request index), so an expiry or a sweep of any release gives a key's
 * holds back without knowing about keys.
 *
 * Nullable columns and constant defaults change only the catalogue. The
 * rules are CHECK constraints added NOT VALID: they hold for every row
 * written from now on, and the rows already there pass them by construction
 * (the new columns are NULL or at their default), so no scan runs under the
 * table's lock.
 */
export const addKeyLimits: SchemaMigration = {
  name: "20261127100000_add_key_limits",
  transactional: true,
  async up(db: Knex | Knex.Transaction): Promise<void> {
    await db.raw(`
      ALTER TABLE api_keys
        ADD COLUMN expires_at timestamptz,
        ADD COLUMN scopes text[],
        ADD COLUMN budget_units bigint,
        ADD COLUMN budget_period text,
        ADD COLUMN rate_limit integer,
        ADD COLUMN budget_spent bigint NOT NULL DEFAULT 0,
        ADD COLUMN budget_period_start timestamptz,
        ADD COLUMN recent timestamptz[] NOT NULL DEFAULT '{}',
        ADD CONSTRAINT api_keys_scopes_known CHECK (scopes <@ ARRAY['decisions', 'search']::text[] AND cardinality(scopes) > 0) NOT VALID,
        ADD CONSTRAINT api_keys_budget_not_negative CHECK (budget_units >= 0) NOT VALID,
        ADD CONSTRAINT api_keys_budget_period_known CHECK (budget_period IN ('day', 'week', 'month', 'total')) NOT VALID,
        ADD CONSTRAINT api_keys_budget_has_period CHECK ((budget_units IS NULL) = (budget_period IS NULL)) NOT VALID,
        ADD CONSTRAINT api_keys_rate_limit_positive CHECK (rate_limit > 0) NOT VALID,
        ADD CONSTRAINT api_keys_budget_spent_not_negative CHECK (budget_spent >= 0) NOT VALID;
    `);
  },
};
