import type { SchemaMigration } from "./schema-migration.js";

/**
 * The usage roll-up: finished calls counted per hour and per UTC day, account,
 * endpoint and key, and the one-row state that says up to which hour they
 * are counted.
 * New tables only; no foreign key, so no lock is taken on a hot table.
 */
export const createUsageRollup: SchemaMigration = {
  name: "20261127142000_create_usage_rollup",
  transactional: true,
  async up(db) {
    await db.raw(`
      CREATE TABLE usage_hourly (
        account_id uuid NOT NULL,
        hour timestamptz NOT NULL,
        endpoint text NOT NULL,
        key_id uuid,
        calls bigint NOT NULL,
        charged bigint NOT NULL
      );
      -- One row per bucket, calls without a key included: an hour counted twice fails instead of doubling.
      CREATE UNIQUE INDEX usage_hourly_bucket
        ON usage_hourly (account_id, hour, endpoint, (coalesce(key_id, '00000000-0000-0000-0000-000000000000'::uuid)));

      -- The same counts per UTC day: a year per day reads a few rows a day, however many keys.
      CREATE TABLE usage_daily (
        account_id uuid NOT NULL,
        day timestamptz NOT NULL,
        endpoint text NOT NULL,
        key_id uuid,
        calls bigint NOT NULL,
        charged bigint NOT NULL
      );
      CREATE UNIQUE INDEX usage_daily_bucket
        ON usage_daily (account_id, day, endpoint, (coalesce(key_id, '00000000-0000-0000-0000-000000000000'::uuid)));

      CREATE TABLE usage_rollup_state (
        id boolean PRIMARY KEY DEFAULT true CHECK (id),
        -- Every hour before this one is in usage_hourly; null until the first roll.
        rolled_until timestamptz
      );
      INSERT INTO usage_rollup_state (id) VALUES (true);
    `);
  },
};
