// A child process for test/db/embedded-store.test.ts: a real thread that dies
// (`exit`: process.exit(7); `throw`: an uncaught error), watched as the
// embedded store's thread is. `closing` marks the store as being closed first.
// Without the watcher the interval would keep this process alive.
import { Worker } from "node:worker_threads";
import { watchStoreThread } from "../../src/db/embedded.js";
import { createLogger } from "../../src/logger.js";

const [how, closing] = process.argv.slice(2);
const body = how === "throw" ? "setTimeout(() => { throw new Error('PGlite aborted') }, 20)" : "setTimeout(() => process.exit(7), 20)";
const thread = new Worker(body, { eval: true });
const watch = watchStoreThread(thread, "/srv/typesafe-data", createLogger("info"));
if (closing === "closing") watch.closing();
else setInterval(() => {}, 1_000);
