import type { Knex } from "knex";

/**
 * A migration of the release-safe kind: it runs while replicas of the
 * previous release serve on the same database (docs/upgrades.md gives the
 * rules and their reasons). The runner applies each one alone, with a lock
 * timeout and a statement timeout already set, and runs it again when a lock
 * was not had in time.
 *
 * Applied migrations are recorded in `schema_migrations`, never in knex's
 * table, whose exact contents older releases check at start.
 */
export type SchemaMigration = TransactionalMigration | NonTransactionalMigration;

interface MigrationBase {
  /** `YYYYMMDDHHMMSS_verb_object`; the order of application. */
  name: string;
  /**
   * Set only on a contract migration (one that drops or changes what an
   * older release still uses): the oldest migration a release must know to
   * keep serving once this one is applied. A release that does not know it
   * refuses to start, naming both schemas. Expand migrations leave it unset:
   * every release since the runner serves on.
   */
  servedFrom?: string;
}

/** Runs in one transaction of its own, recorded by the same transaction. */
export interface TransactionalMigration extends MigrationBase {
  transactional: true;
  up(trx: Knex.Transaction): Promise<void>;
}

/**
 * Statements PostgreSQL refuses inside a transaction (`CREATE INDEX
 * CONCURRENTLY`), run one by one on one connection. A failure part way
 * leaves some applied, so each must be safe to run again (`IF NOT EXISTS`);
 * the runner drops an index that a failed build left invalid before it runs
 * the statements again.
 */
export interface NonTransactionalMigration extends MigrationBase {
  transactional: false;
  statements: readonly string[];
}
