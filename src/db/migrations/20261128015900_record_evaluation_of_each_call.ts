import type { SchemaMigration } from "./schema-migration.js";

/** Which evaluation a call paid for; NULL for the API's calls. A nullable column without a default: no rewrite. */
export const recordEvaluationOfEachCall: SchemaMigration = {
  name: "20261128015900_record_evaluation_of_each_call",
  transactional: true,
  async up(db) {
    await db.raw("ALTER TABLE requests ADD COLUMN evaluation_id uuid");
  },
};
