import type { SchemaMigration } from "./schema-migration.js";

/**
 * The periodic `key.expiring` check reads the live keys that expire soon;
 * only keys with an expiry are indexed, built without blocking writes.
 */
export const indexExpiringKeys: SchemaMigration = {
  name: "20261127141100_index_expiring_keys",
  transactional: false,
  statements: [
    `CREATE INDEX CONCURRENTLY IF NOT EXISTS api_keys_expiring ON api_keys (expires_at) WHERE expires_at IS NOT NULL AND revoked_at IS NULL`,
  ],
};
