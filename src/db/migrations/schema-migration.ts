import type { Knex } from "knex";

/**
 * A migration of the release-safe kind: it runs while replicas of the
 * previous release serve on the same database (docs/upgrades.md gives the
 * rules and their reasons). The runner applies each one alone, in a
 * transaction of its own unless it says otherwise, with a lock timeout and a
 * statement timeout already set, and retries it when a lock is not had.
 *
 * Applied migrations are recorded in `schema_migrations`, never in knex's
 * table, whose exact contents older releases check at start.
 */
export interface SchemaMigration {
  /** `YYYYMMDDHHMMSS_verb_object`; the order of application. */
  name: string;
  /**
   * False for a statement PostgreSQL refuses inside a transaction
   * (`CREATE INDEX CONCURRENTLY`). Such a migration must be safe to run
   * again after failing part way (`IF NOT EXISTS`, dropping an invalid index first).
   */
  transactional: boolean;
  /**
   * Set only on a contract migration (one that drops or changes what an
   * older release still uses): the oldest migration a release must know to
   * keep serving once this one is applied. A release that does not know it
   * refuses to start, naming both schemas. Expand migrations leave it unset:
   * every release since the runner serves on.
   */
  servedFrom?: string;
  up(db: Knex | Knex.Transaction): Promise<void>;
}
