// `npm run lint:migrations`: applies every migration to a fresh database on the
// server of DATABASE_URL (or a private cluster of Debian's PostgreSQL binaries)
// and lints the SQL each one ran. Exits 1 when one breaks a release-safe rule
// (docs/upgrades.md).
import { lintMigrations } from "../support/migration-lint.js";
import { startPrivateCluster } from "../support/private-cluster.js";

const cluster = process.env.DATABASE_URL ? undefined : await startPrivateCluster();
try {
  const result = await lintMigrations(process.env.DATABASE_URL ?? cluster!.url);
  let failed = 0;
  for (const migration of result.migrations) {
    if (migration.allowedBecause) {
      console.log(`allowed  ${migration.name}: ${migration.allowedBecause}`);
    } else if (migration.problems.length === 0) {
      console.log(`ok       ${migration.name}`);
    } else {
      failed++;
      console.log(`FAILED   ${migration.name}`);
      for (const problem of migration.problems) console.log(`           ${problem}`);
    }
  }
  const linted = result.migrations.filter((m) => !m.allowedBecause).length;
  console.log(`migration lint (squawk and the function check): ${linted - failed} passed, ${failed} failed`);
  process.exitCode = failed === 0 ? 0 : 1;
} finally {
  cluster?.stop();
}
