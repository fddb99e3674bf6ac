// Compiles src/ to dist/ (`npm run build`), then bundles the server into one
// file, dist/bundle/main.mjs, which `npm start` runs, and the account page into
// dist/public/account/, which the server serves at /account/. With --if-stale it
// builds only when a source or the compiler settings changed since the last
// successful build, so a start costs a start, not a compilation. Plain
// JavaScript: it runs before anything is compiled. `npm start` imports it
// (src/start.mjs) instead of running it, which saves a second Node process.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import esbuild from "esbuild";
import { bundleAccountPage } from "./web/bundle-account-page.mjs";

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

/**
 * The server as one ES module. Loading dist/ file by file resolves and reads
 * hundreds of modules (most of them lodash's, through knex), a large part of a
 * start on a machine with slow system calls; one file is a single read and compile.
 * Packages stay outside when they load files of their own (PGlite's WASM) or
 * are drivers knex names but this service never loads. dist/bundle/ sits two
 * levels below the root, like dist/openapi/, so paths relative to a module
 * (the OpenAPI document) resolve the same from either.
 */
function bundleServer() {
  const knexDriversNotUsed = ["mysql", "mysql2", "mariadb", "mariadb/callback", "oracledb", "tedious", "sqlite3", "better-sqlite3", "pg-query-stream", "pg-native"];
  esbuild.buildSync({
    entryPoints: [path.join(root, "dist", "main.js")],
    outfile: path.join(root, "dist", "bundle", "main.mjs"),
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    external: ["@electric-sql/pglite", ...knexDriversNotUsed],
    // Bundled CommonJS packages call require(); an ES module has none of its own.
    banner: { js: "import { createRequire as bundleCreateRequire } from 'node:module'; const require = bundleCreateRequire(import.meta.url);" },
    sourcemap: true,
    logLevel: "warning",
  });
}

/** Compiles src/ to dist/ (only when stale, with `ifStale`). Returns 0 when dist/ is fresh, else tsc's exit status. */
export function build({ ifStale }) {
  const builtAt = modified(stamp);
  const sourcesAt = Math.max(newestIn(path.join(root, "src")), ...["package.json", "tsconfig.json", "tsconfig.build.json"].map((f) => modified(path.join(root, f)) ?? 0));
  if (ifStale && builtAt !== undefined && builtAt >= sourcesAt) return 0;
  // Said before the seconds of silence a compilation takes; on stderr, so the CLI's JSON on stdout stays clean.
  process.stderr.write(`typesafe: building dist/ from src/ (takes a few seconds, once after each change)\n`);
  const tsc = spawnSync(process.execPath, [path.join(root, "node_modules/typescript/bin/tsc"), "-p", "tsconfig.build.json"], { cwd: root, stdio: "inherit" });
  if (tsc.status !== 0) return tsc.status ?? 1;
  bundleServer();
  bundleAccountPage();
  fs.writeFileSync(stamp, new Date().toISOString() + "\n");
  return 0;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  process.exitCode = build({ ifStale: process.argv.includes("--if-stale") });
}
