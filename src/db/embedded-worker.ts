import { parentPort, workerData } from "node:worker_threads";
import { PGlite } from "@electric-sql/pglite";
import { serveWire } from "./pglite-wire.js";

/**
 * The embedded store's thread: PGlite and its wire server, off the service's
 * main thread, so PostgreSQL's own work (most of an embedded call's CPU) runs
 * on the second core while the main thread serves HTTP and gRPC. Both sides
 * speak only the PostgreSQL protocol, over the loopback port.
 *
 * Messages: this thread posts `{ url }` once the store is open; on any message
 * from the parent it closes the wire and PGlite and ends with exit code 0.
 * A failure to open is thrown, which the parent receives as an "error" event.
 */
export interface EmbeddedWorkerData {
  dataDir: string;
}

const { dataDir } = workerData as EmbeddedWorkerData;
const db = await PGlite.create(dataDir);
const wire = await serveWire(db);
parentPort!.postMessage({ url: wire.url });
parentPort!.once("message", async () => {
  await wire.close();
  await db.close();
  process.exit(0);
});
