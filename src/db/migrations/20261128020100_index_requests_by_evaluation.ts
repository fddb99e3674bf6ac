import type { SchemaMigration } from "./schema-migration.js";

/** The usage of one evaluation reads its calls; only calls of an evaluation are indexed, built without blocking writes. */
export const indexRequestsByEvaluation: SchemaMigration = {
  name: "20261128020100_index_requests_by_evaluation",
  transactional: false,
  statements: [`CREATE INDEX CONCURRENTLY IF NOT EXISTS requests_evaluation ON requests (evaluation_id) WHERE evaluation_id IS NOT NULL`],
};
