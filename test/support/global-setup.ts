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
    /** A closed, migrated embedded store that files needing a store of their own copy (test/support/database.ts). */
    embeddedTemplateDir: string;
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
    project.provide("embeddedTemplateDir", "");
    return;
  }
  // Migrated once into a template, closed, then copied: reopening a copy takes a fraction of a fresh store's start.
  const templateDir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-test-template-"));
  const { openEmbeddedStore } = await import("../../src/db/embedded.js");
  const template = await openEmbeddedStore(templateDir, createLogger("silent"));
  const db = createKnex(template.url, 1);
  await migrate(db, { useAdvisoryLock: false });
  await db.destroy();
  await template.close();
  const dataDir = await copyEmbeddedStore(templateDir);
  const store = await openEmbeddedStore(dataDir, createLogger("silent"));
  project.provide("embeddedDatabaseUrl", store.url);
  project.provide("embeddedTemplateDir", templateDir);
  return async () => {
    await store.close();
    await fs.rm(dataDir, { recursive: true, force: true });
    await fs.rm(templateDir, { recursive: true, force: true });
  };
}

/** A copy of a closed embedded store's folder in a new temp folder, without its owner's lock and address files. */
export async function copyEmbeddedStore(templateDir: string): Promise<string> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-test-"));
  await fs.cp(templateDir, dataDir, { recursive: true, filter: (file) => !["owner.lock", "socket.json"].includes(path.basename(file)) });
  return dataDir;
}
