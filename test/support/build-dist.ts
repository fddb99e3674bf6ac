import { spawn } from "node:child_process";
import path from "node:path";

const root = path.resolve(import.meta.dirname, "../..");

/**
 * Builds dist/ when a source changed since its last build (what `npm run
 * admin` does before each command), so a test never runs a stale build.
 * vitest's global setup calls it once before the workers start, so two
 * workers never build at once; in a worker it finds dist/ fresh.
 */
export function buildIfStale(): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["src/build.mjs", "--if-stale"], { cwd: root, stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk));
    child.on("error", reject);
    child.on("close", (code) => (code === 0 ? resolve() : reject(new Error(`node src/build.mjs --if-stale exited with ${code}:\n${stderr}`))));
  });
}

/** vitest global setup: dist/ is fresh before any test spawns it. */
export default async function setup() {
  await buildIfStale();
}
