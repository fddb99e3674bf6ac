import type { SchemaMigration } from "./schema-migration.js";

/**
 * Lets the usage roll-up find one hour's calls of every account. A BRIN index
 * stays tiny and cheap to keep on a table written in time order; it is built
 * without blocking writes to requests.
 */
export const indexRequestsByCreation: SchemaMigration = {
  name: "20261127142100_index_requests_by_creation",
  transactional: false,
  statements: ["CREATE INDEX CONCURRENTLY IF NOT EXISTS requests_created_brin ON requests USING brin (created_at) WITH (autosummarize = on)"],
};
