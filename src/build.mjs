// Compiles src/ to dist/ (`npm run build`, and `npm install` through the
// `prepare` script), then bundles the server into one file,
// dist/bundle/main.mjs, which `npm start` runs, the operator CLI into
// dist/bundle/admin.mjs, which `npm run admin` runs, and the account page into
// dist/public/account/, which the server serves at /account/. With --if-stale it
// builds only when a source or the compiler settings changed since the last
// successful build, so a start costs a start, not a compilation. The build
// strips types with esbuild and checks none: type checking is `npm run
// typecheck` (CI runs it), a whole-program pass many times slower than the
// build. Plain JavaScript: it runs before anything is compiled. `npm start`
// imports it (src/start.mjs) instead of running it, which saves a second Node process.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { createRequire } from "node:module";
import { bundleAccountPage } from "./web/bundle-account-page.mjs";

const root = path.resolve(import.meta.dirname, "..");
/**
 * esbuild, loaded only when a build runs: loading it costs more than the
 * staleness check, which every `npm start` and `npm run admin` makes.
 */
const loadEsbuild = () => createRequire(import.meta.url)("esbuild");
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
 * An entry point as one ES module. Loading dist/ file by file resolves and reads
 * hundreds of modules (most of them lodash's, through knex), a large part of a
 * start on a machine with slow system calls; one file is a single read and compile.
 * Packages stay outside when they load files of their own (PGlite's WASM,
 * node-llama-cpp's native binary, found from its own folder) or
 * are drivers knex names but this service never loads. dist/bundle/ sits two
 * levels below the root, like dist/openapi/, so paths relative to a module
 * (the OpenAPI document, the embedded store's worker) resolve the same from either.
 */
function bundle(entry, outName) {
  const knexDriversNotUsed = ["mysql", "mysql2", "mariadb", "mariadb/callback", "oracledb", "tedious", "sqlite3", "better-sqlite3", "pg-query-stream", "pg-native"];
  loadEsbuild().buildSync({
    entryPoints: [path.join(root, "src", entry)],
    outfile: path.join(root, "dist", "bundle", outName),
    bundle: true,
    platform: "node",
    format: "esm",
    target: "node20",
    external: ["@electric-sql/pglite", "node-llama-cpp", ...knexDriversNotUsed],
    // Bundled CommonJS packages call require(); an ES module has none of its own.
    banner: { js: "import { createRequire as bundleCreateRequire } from 'node:module'; const require = bundleCreateRequire(import.meta.url);" },
    sourcemap: true,
    logLevel: "warning",
  });
}

/**
 * Every module of src/ as its own file in dist/ (what the store's worker
 * thread loads), types stripped; the account page's sources are browser
 * code, bundled on their own.
 */
function compileModules() {
  const src = path.join(root, "src");
  const entryPoints = fs
    .readdirSync(src, { recursive: true })
    .filter((f) => f.endsWith(".ts") && !f.endsWith(".d.ts") && !f.startsWith(`web${path.sep}page${path.sep}`))
    .map((f) => path.join(src, f));
  loadEsbuild().buildSync({ entryPoints, outdir: path.join(root, "dist"), outbase: src, platform: "node", format: "esm", target: "node20", sourcemap: true, logLevel: "warning" });
  return entryPoints.length;
}

/** Runs one step of the build and says how long it took. */
function step(say, what, run) {
  const started = performance.now();
  const result = run();
  say(`typesafe: ${typeof what === "function" ? what(result) : what} (${((performance.now() - started) / 1000).toFixed(1)} s)`);
}

/**
 * Builds dist/ (only when stale, with `ifStale`); returns 0 when dist/ is
 * fresh, 1 when a step failed (esbuild has printed why). Each step says when
 * it is done, on stderr, so the CLI's JSON on stdout stays clean.
 */
export function build({ ifStale, say = (line) => process.stderr.write(`${line}\n`) }) {
  const builtAt = modified(stamp);
  const sourcesAt = Math.max(newestIn(path.join(root, "src")), ...["package.json", "tsconfig.json"].map((f) => modified(path.join(root, f)) ?? 0));
  if (ifStale && builtAt !== undefined && builtAt >= sourcesAt) return 0;
  say(`typesafe: building dist/ from src/ (${builtAt === undefined ? "first build" : "a source changed"}; a few seconds)`);
  const started = performance.now();
  try {
    step(say, (n) => `compiled ${n} modules`, compileModules);
    step(say, "bundled the server", () => bundle("main.ts", "main.mjs"));
    // The CLI starts once per command: one file to load is most of what a command costs.
    step(say, "bundled the operator CLI", () => bundle("admin/cli.ts", "admin.mjs"));
    step(say, "bundled the account page", () => bundleAccountPage());
  } catch {
    say("typesafe: the build failed; the errors are above");
    return 1;
  }
  fs.writeFileSync(stamp, new Date().toISOString() + "\n");
  say(`typesafe: built in ${((performance.now() - started) / 1000).toFixed(1)} s`);
  return 0;
}

/** Where a first start finds a fresh store to copy (src/db/embedded.ts reads the same folder). */
const storeTemplate = path.join(root, "dist", "store-template");

/**
 * A fresh embedded store (PGlite's data folder right after its initdb), made
 * once per PGlite version at install, so a first start copies it instead of
 * spending seconds in initdb. Only the install and `npm run build` make it;
 * without it a first start creates the store as before, so a failure here is
 * reported and the install goes on.
 */
export async function makeStoreTemplate({ say = (line) => process.stderr.write(`${line}\n`) } = {}) {
  const version = JSON.parse(fs.readFileSync(path.join(root, "node_modules", "@electric-sql", "pglite", "package.json"), "utf8")).version;
  const stamp = path.join(storeTemplate, ".pglite-version");
  if (fs.existsSync(stamp) && fs.readFileSync(stamp, "utf8") === version) return;
  const started = performance.now();
  const staging = `${storeTemplate}.staging-${process.pid}`;
  try {
    fs.rmSync(staging, { recursive: true, force: true });
    const { PGlite } = await import("@electric-sql/pglite");
    const store = await PGlite.create(staging);
    await store.close();
    fs.writeFileSync(path.join(staging, ".pglite-version"), version);
    fs.rmSync(storeTemplate, { recursive: true, force: true });
    fs.renameSync(staging, storeTemplate);
    say(`typesafe: made a fresh embedded store for first starts (${((performance.now() - started) / 1000).toFixed(1)} s)`);
  } catch (err) {
    fs.rmSync(staging, { recursive: true, force: true });
    say(`typesafe: no fresh embedded store was made (${err instanceof Error ? err.message : String(err)}); a first start creates one instead`);
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  process.exitCode = build({ ifStale: process.argv.includes("--if-stale") });
  if (process.exitCode === 0) await makeStoreTemplate();
}
