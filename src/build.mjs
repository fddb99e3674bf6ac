// Compiles src/ to dist/ (`npm run build`). With --if-stale (npm start's and
// npm run admin's pre-step) it compiles only when a source or the compiler
// settings changed since the last successful build, so a start costs a start
// (~0.3 s), not a compilation (~3 s). Plain JavaScript: it runs before
// anything is compiled.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

const root = path.resolve(import.meta.dirname, "..");
/** Written after a build that succeeded: a failed build never counts as fresh. */
const stamp = path.join(root, "dist", ".built");

function modified(file) {
  try {
    return fs.statSync(file).mtimeMs;
  } catch {
    return undefined;
  }
}

function newestIn(dir) {
  let newest = 0;
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const full = path.join(dir, entry.name);
    newest = Math.max(newest, entry.isDirectory() ? newestIn(full) : (modified(full) ?? 0));
  }
  return newest;
}

const builtAt = modified(stamp);
const sourcesAt = Math.max(newestIn(path.join(root, "src")), ...["package.json", "tsconfig.json", "tsconfig.build.json"].map((f) => modified(path.join(root, f)) ?? 0));
if (process.argv.includes("--if-stale") && builtAt !== undefined && builtAt >= sourcesAt) process.exit(0);

const tsc = spawnSync(process.execPath, [path.join(root, "node_modules/typescript/bin/tsc"), "-p", "tsconfig.build.json"], { cwd: root, stdio: "inherit" });
if (tsc.status !== 0) process.exit(tsc.status ?? 1);
fs.writeFileSync(stamp, new Date().toISOString() + "\n");
