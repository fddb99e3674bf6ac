import fs from "node:fs/promises";
import { PGlite } from "@electric-sql/pglite";
import type { Logger } from "../logger.js";
import { socketFilePath } from "./database.js";
import { serveWire } from "./pglite-wire.js";
import { lockStore } from "./store-lock.js";

export interface EmbeddedStore {
  url: string;
  close(): Promise<void>;
}

/**
 * Starts PGlite on dataDir and serves it on a loopback port, published in
 * dataDir/socket.json so the operator CLI can reach the running store.
 * PGlite's folder cannot be opened by two processes: the folder's lock is
 * taken before anything is opened, so a second service or CLI is refused
 * (naming the owner) and never touches the owner's files.
 */
export async function openEmbeddedStore(dataDir: string, logger: Logger): Promise<EmbeddedStore> {
  await fs.mkdir(dataDir, { recursive: true });
  const lock = await lockStore(dataDir, () => publishedUrl(dataDir));
  let pglite: PGlite | undefined;
  try {
    pglite = await PGlite.create(dataDir);
    const wire = await serveWire(pglite);
    await fs.writeFile(socketFilePath(dataDir), JSON.stringify({ url: wire.url, pid: process.pid }), { mode: 0o600 });
    logger.info("embedded database ready", { data_dir: dataDir });
    const opened = pglite;
    return {
      url: wire.url,
      close: async () => {
        await fs.rm(socketFilePath(dataDir), { force: true });
        await wire.close();
        await opened.close();
        await lock.release();
      },
    };
  } catch (err) {
    await pglite?.close().catch(() => undefined);
    await lock.release();
    throw err;
  }
}

/** The URL the folder's owner published, without checking that it is alive (for messages). */
async function publishedUrl(dataDir: string): Promise<string | undefined> {
  try {
    return (JSON.parse(await fs.readFile(socketFilePath(dataDir), "utf8")) as { url?: string }).url;
  } catch {
    return undefined;
  }
}
