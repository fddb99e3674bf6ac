import type { Knex } from "knex";
import { schemaMigrations } from "./migrations/index.js";

/**
 * A stand-in for the release-safe migration runner until it lands: applies
 * each migration of `schemaMigrations` not yet recorded in
 * `schema_migrations`, one transaction each, under the same advisory lock
 * replicas share. The runner replaces this module whole.
 */
export async function applySchemaMigrationsInterim(db: Knex): Promise<void> {
  await db.transaction(async (tx) => {
    await tx.raw("SELECT pg_advisory_xact_lock(7261127)");
    await tx.raw("CREATE TABLE IF NOT EXISTS schema_migrations (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())");
    const applied = new Set(await tx("schema_migrations").pluck<string[]>("name"));
    for (const migration of schemaMigrations) {
      if (applied.has(migration.name)) continue;
      await migration.up(tx);
      await tx("schema_migrations").insert({ name: migration.name });
    }
  });
}
