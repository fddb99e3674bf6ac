import fs from "node:fs/promises";
import { PGlite } from "@electric-sql/pglite";
import { PGLiteSocketServer } from "@electric-sql/pglite-socket";
import type { Logger } from "../logger.js";
import { socketFilePath } from "./database.js";

export interface EmbeddedStore {
  url: string;
  close(): Promise<void>;
}

/**
 * Starts PGlite on dataDir and serves it on a loopback port, published in
 * dataDir/socket.json so the operator CLI can reach the running store
 * (PGlite's folder cannot be opened by two processes).
 */
export async function openEmbeddedStore(dataDir: string, logger: Logger, maxConnections = 16): Promise<EmbeddedStore> {
  await fs.mkdir(dataDir, { recursive: true });
  const pglite = await PGlite.create(dataDir);
  const server = new PGLiteSocketServer({ db: pglite, host: "127.0.0.1", port: 0, maxConnections });
  await server.start();
  const url = `postgres://postgres@${server.getServerConn()}/postgres?sslmode=disable`;
  await fs.writeFile(socketFilePath(dataDir), JSON.stringify({ url, pid: process.pid }), { mode: 0o600 });
  logger.info("embedded database ready", { data_dir: dataDir });
  return {
    url,
    close: async () => {
      await fs.rm(socketFilePath(dataDir), { force: true });
      await server.stop();
      await pglite.close();
    },
  };
}
