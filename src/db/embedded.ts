import fs from "node:fs/promises";
import { PGlite } from "@electric-sql/pglite";
import type { Logger } from "../logger.js";
import { socketFilePath } from "./database.js";
import { serveWire } from "./pglite-wire.js";

export interface EmbeddedStore {
  url: string;
  close(): Promise<void>;
}

/**
 * Starts PGlite on dataDir and serves it on a loopback port, published in
 * dataDir/socket.json so the operator CLI can reach the running store
 * (PGlite's folder cannot be opened by two processes).
 */
export async function openEmbeddedStore(dataDir: string, logger: Logger): Promise<EmbeddedStore> {
  await fs.mkdir(dataDir, { recursive: true });
  const pglite = await PGlite.create(dataDir);
  const wire = await serveWire(pglite);
  await fs.writeFile(socketFilePath(dataDir), JSON.stringify({ url: wire.url, pid: process.pid }), { mode: 0o600 });
  logger.info("embedded database ready", { data_dir: dataDir });
  return {
    url: wire.url,
    close: async () => {
      await fs.rm(socketFilePath(dataDir), { force: true });
      await wire.close();
      await pglite.close();
    },
  };
}
