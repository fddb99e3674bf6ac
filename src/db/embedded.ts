import { once } from "node:events";
import fs from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Worker } from "node:worker_threads";
import type { Logger } from "../logger.js";
import { publishedUrl, socketFilePath } from "./published-socket.js";
import type { EmbeddedWorkerData } from "./embedded-worker.js";
import { lockStore } from "./store-lock.js";

export interface EmbeddedStore {
  url: string;
  close(): Promise<void>;
}

/**
 * Starts PGlite on dataDir in a worker thread (embedded-worker.ts) and serves
 * it on a loopback port, published in dataDir/socket.json so the operator CLI
 * can reach the running store. PGlite's folder cannot be opened by two
 * processes: the folder's lock is taken before anything is opened, so a second
 * service or CLI is refused (naming the owner) and never touches the owner's
 * files.
 */
export async function openEmbeddedStore(dataDir: string, logger: Logger): Promise<EmbeddedStore> {
  await fs.mkdir(dataDir, { recursive: true });
  const lock = await lockStore(dataDir, () => publishedUrl(dataDir));
  let worker: Worker | undefined;
  let watch: { closing(): void } | undefined;
  try {
    await seedStore(dataDir, STORE_TEMPLATE, logger);
    worker = startStoreThread({ dataDir });
    const [{ url }] = (await once(worker, "message")) as [{ url: string }];
    const opened = worker;
    watch = watchStoreThread(opened, dataDir, logger);
    await fs.writeFile(socketFilePath(dataDir), JSON.stringify({ url, pid: process.pid }), { mode: 0o600 });
    logger.info("embedded database ready", { data_dir: dataDir });
    return {
      url,
      close: async () => {
        watch?.closing();
        await fs.rm(socketFilePath(dataDir), { force: true });
        const exited = once(opened, "exit");
        opened.postMessage("close");
        const [code] = (await exited) as [number];
        await lock.release();
        if (code !== 0) throw new Error(`the embedded store's thread exited with ${code} while closing`);
      },
    };
  } catch (err) {
    watch?.closing();
    await worker?.terminate();
    await lock.release();
    throw err;
  }
}

/**
 * The fresh store the install made (src/build.mjs), beside the compiled modules: dist/store-template from
 * dist/db/ and dist/bundle/ alike. Run from the TypeScript sources (tests, tsx scripts) it is the same
 * folder, dist/ beside src/; when it is missing a first start runs initdb as before.
 */
const STORE_TEMPLATE = fileURLToPath(new URL(import.meta.url.endsWith(".ts") ? "../../dist/store-template" : "../store-template", import.meta.url));

/**
 * Copies a fresh store into a data folder that holds none, which saves a
 * first start PGlite's initdb. The copy is made beside the store's files and
 * moved in entry by entry, PG_VERSION last, so a start cut short leaves a
 * folder PGlite still sees as empty.
 */
export async function seedStore(dataDir: string, template: string, logger: Logger): Promise<boolean> {
  const has = (folder: string) => fs.access(path.join(folder, "PG_VERSION")).then(() => true, () => false);
  if ((await has(dataDir)) || !(await has(template))) return false;
  const staging = path.join(dataDir, `.store-template-${process.pid}`);
  await fs.rm(staging, { recursive: true, force: true });
  await fs.cp(template, staging, { recursive: true });
  const entries = (await fs.readdir(staging)).filter((e) => e !== ".pglite-version" && e !== "PG_VERSION");
  for (const entry of [...entries, "PG_VERSION"]) {
    await fs.rm(path.join(dataDir, entry), { recursive: true, force: true });
    await fs.rename(path.join(staging, entry), path.join(dataDir, entry));
  }
  await fs.rm(staging, { recursive: true, force: true });
  logger.info("embedded database created from the install's fresh store", { data_dir: dataDir });
  return true;
}

/**
 * A store whose thread has died is gone for good: unless it is being closed,
 * the process logs why and exits with status 1, for its supervisor to restart
 * it, rather than answer 503 until someone notices.
 */
export function watchStoreThread(thread: Worker, dataDir: string, logger: Logger): { closing(): void } {
  let closing = false;
  thread.on("error", (err) => logger.error("embedded database failed", { data_dir: dataDir, error: err }));
  thread.once("exit", (code) => {
    if (closing) return;
    logger.error("embedded database stopped", { data_dir: dataDir, exit_code: code });
    process.exit(1);
  });
  return { closing: () => void (closing = true) };
}

/**
 * The store's thread. Compiled, its module is dist/db/embedded-worker.js,
 * reached by the same relative path from dist/db/ and from the bundle in
 * dist/bundle/; run from the TypeScript sources, it is the .ts file beside
 * this one, loaded through typescript-worker.mjs.
 */
function startStoreThread(workerData: EmbeddedWorkerData): Worker {
  if (!import.meta.url.endsWith(".ts")) return new Worker(new URL("../db/embedded-worker.js", import.meta.url), { workerData });
  const typescriptModule = new URL("./embedded-worker.ts", import.meta.url).href;
  return new Worker(new URL("./typescript-worker.mjs", import.meta.url), { workerData: { ...workerData, typescriptModule } });
}
