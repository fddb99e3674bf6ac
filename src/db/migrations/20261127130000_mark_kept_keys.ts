import type { SchemaMigration } from "./schema-migration.js";

/**
 * Removing a member revokes the keys they created unless the owner keeps
 * them; a kept key records who kept it and when. Nullable columns without a
 * default change only the catalogue: the brief lock on api_keys is the only
 * one taken, and older releases never read the columns.
 */
export const markKeptKeys: SchemaMigration = {
  name: "20261127130000_mark_kept_keys",
  transactional: true,
  async up(trx) {
    await trx.raw(`ALTER TABLE api_keys ADD COLUMN kept_by text, ADD COLUMN kept_at timestamptz`);
  },
};
