import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { TestProject } from "vitest/node";
import { createLogger } from "../../src/logger.js";
import { createKnex, migrate } from "../../src/db/database.js";

declare module "vitest" {
  export interface ProvidedContext {
    /** URL of the test run's embedded store when no DATABASE_URL is set. */
    embeddedDatabaseUrl: string;
  }
}

/**
 * With DATABASE_URL every test file gets a fresh database on that server
 * (test/support/database.ts). Without it, one embedded PGlite serves the whole
 * run (a fresh PGlite takes seconds to initialize), migrated once here.
 */
export default async function setup(project: TestProject) {
  if (process.env.DATABASE_URL) {
    project.provide("embeddedDatabaseUrl", "");
    return;
  }
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-test-"));
  const { openEmbeddedStore } = await import("../../src/db/embedded.js");
  const store = await openEmbeddedStore(dataDir, createLogger("silent"));
  const db = createKnex(store.url, 1);
  await migrate(db, { useAdvisoryLock: false });
  await db.destroy();
  project.provide("embeddedDatabaseUrl", store.url);
  return async () => {
    await store.close();
    await fs.rm(dataDir, { recursive: true, force: true });
  };
}
