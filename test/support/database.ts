import crypto from "node:crypto";
import fs from "node:fs/promises";
import type { Knex } from "knex";
import { afterAll, beforeAll, inject } from "vitest";
import { createKnex, migrate } from "../../src/db/database.js";
import { openEmbeddedStore } from "../../src/db/embedded.js";
import { prepareStatementsOn } from "../../src/metering/ledger.js";
import { createLogger } from "../../src/logger.js";
import { copyEmbeddedStore } from "./global-setup.js";
import { postgresBinaries, startPrivateCluster, type PrivateCluster } from "./private-cluster.js";

export interface TestDatabase {
  /** Connection string a spawned server process can use. */
  url: string;
  db: Knex;
  /** True on a real PostgreSQL server, where concurrent sessions really race. */
  isExternal: boolean;
  close(): Promise<void>;
}

export interface TestDatabaseOptions {
  /**
   * The file sweeps expired holds of every account (the sweeper's clock moved
   * past other tests' leases): without DATABASE_URL it gets an embedded store
   * of its own (slower to open), since on the shared one its sweeps would expire
   * the holds of files running beside it.
   */
  sweepsEveryAccount?: boolean;
  /** The file changes the schema's bookkeeping (knex's migration tables): a store of its own, as above. */
  changesSchema?: boolean;
  /** The file runs or claims evaluations, and a runner takes those of every account on its store: a store of its own, as above. */
  runsEvaluations?: boolean;
  /**
   * The file counts what its services do with its webhook deliveries: a store
   * of its own, as above, since every service on the shared store (other
   * files', with other loopback and retry settings) delivers every account's
   * due deliveries.
   */
  countsDeliveries?: boolean;
}

/**
 * A migrated database for one test file: a fresh database on the server of
 * DATABASE_URL, or the run's shared embedded store (tests then use their own
 * accounts and never assume an empty database).
 */
export async function createTestDatabase(poolMax = 10, options: TestDatabaseOptions = {}): Promise<TestDatabase> {
  const serverUrl = process.env.DATABASE_URL;
  if (!serverUrl && (options.sweepsEveryAccount || options.changesSchema || options.runsEvaluations || options.countsDeliveries)) return createPrivateEmbeddedDatabase();
  if (!serverUrl) {
    const url = inject("embeddedDatabaseUrl");
    const db = createKnex(url, 1);
    return { url, db, isExternal: false, close: () => db.destroy() };
  }
  const name = `typesafe_test_${crypto.randomBytes(6).toString("hex")}`;
  const admin = createKnex(serverUrl, 1);
  await admin.raw(`CREATE DATABASE ${name}`);
  await admin.destroy();
  const url = new URL(serverUrl);
  url.pathname = `/${name}`;
  const db = createKnex(url.toString(), poolMax);
  await migrate(db, { useAdvisoryLock: true });
  // As the service does on PostgreSQL: the metering statements are named.
  await prepareStatementsOn(db);
  return {
    url: url.toString(),
    db,
    isExternal: true,
    close: async () => {
      await db.destroy();
      const cleanup = createKnex(serverUrl, 1);
      await cleanup.raw(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await cleanup.destroy();
    },
  };
}

async function createPrivateEmbeddedDatabase(): Promise<TestDatabase> {
  // A copy of the run's migrated template (global-setup.ts): a fresh store would initialize and migrate for seconds.
  const dataDir = await copyEmbeddedStore(inject("embeddedTemplateDir"));
  const store = await openEmbeddedStore(dataDir, createLogger("silent"));
  const db = createKnex(store.url, 1);
  await migrate(db, { useAdvisoryLock: false });
  return {
    url: store.url,
    db,
    isExternal: false,
    close: async () => {
      await db.destroy();
      await store.close();
      await fs.rm(dataDir, { recursive: true, force: true });
    },
  };
}

/** True where two sessions really race: DATABASE_URL's server, or a private cluster from PostgreSQL's binaries. */
export const sessionsCanRace = process.env.DATABASE_URL !== undefined || postgresBinaries() !== undefined;

/**
 * For a file whose tests need two sessions at once (the embedded store runs
 * one statement at a time): registers its beforeAll and afterAll, which open
 * a migrated database on DATABASE_URL's server, else on a private cluster, and
 * returns a getter for it. Guard the file's describe with sessionsCanRace.
 */
export function useRacingDatabase(poolMax: number): () => Knex {
  let database: TestDatabase | undefined;
  let cluster: PrivateCluster | undefined;
  let db: Knex | undefined;
  beforeAll(async () => {
    if (process.env.DATABASE_URL !== undefined) {
      database = await createTestDatabase(poolMax);
      db = database.db;
    } else {
      cluster = await startPrivateCluster();
      db = createKnex(cluster.url, poolMax);
      await migrate(db, { useAdvisoryLock: true });
    }
  });
  afterAll(async () => {
    if (database) await database.close();
    else await db?.destroy();
    cluster?.stop();
  });
  return () => {
    if (!db) throw new Error("the racing database is opened in beforeAll");
    return db;
  };
}
