// Bundles the account page (src/web/page/) into a folder of static files:
// index.html and its script and style sheet, named by content hash so they can
// be cached for good while index.html is revalidated. Plain JavaScript like
// build.mjs, which calls it; tests call it too.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const root = path.resolve(import.meta.dirname, "../..");
const source = path.join(root, "src", "web", "page");

/** Where the server looks for the built page (src/web/account-page.ts reads the same folder). */
export const ACCOUNT_PAGE_DIR = path.join(root, "dist", "public", "account");

/**
 * Builds the page into `outDir` (ACCOUNT_PAGE_DIR by default). The folder is
 * written beside its place and renamed into it, so a server never reads half
 * a build (the server also retries a folder it could not read). Returns the
 * names of the files written.
 */
export function bundleAccountPage({ outDir = ACCOUNT_PAGE_DIR } = {}) {
  const staging = `${outDir}.staging-${process.pid}`;
  fs.rmSync(staging, { recursive: true, force: true });
  // Loaded here, not on import: build.mjs imports this module for every staleness check.
  const result = createRequire(import.meta.url)("esbuild").buildSync({
    entryPoints: { app: path.join(source, "app.ts"), style: path.join(source, "app.css") },
    outdir: staging,
    entryNames: "[name]-[hash]",
    bundle: true,
    format: "esm",
    platform: "browser",
    target: ["chrome120", "firefox120", "safari17"],
    minify: true,
    metafile: true,
    logLevel: "warning",
  });
  const outputs = Object.keys(result.metafile.outputs).map((file) => path.basename(file));
  const script = outputs.find((name) => name.endsWith(".js"));
  const style = outputs.find((name) => name.endsWith(".css"));
  if (!script || !style) throw new Error(`account page: esbuild wrote ${outputs.join(", ")}`);
  const html = fs.readFileSync(path.join(source, "index.html"), "utf8");
  const linked = html.replace('href="./app.css"', `href="./${style}"`).replace('src="./app.js"', `src="./${script}"`);
  if (!linked.includes(script) || !linked.includes(style)) throw new Error("account page: index.html no longer links ./app.js and ./app.css");
  fs.writeFileSync(path.join(staging, "index.html"), linked);
  // The old folder steps aside just before the new one takes its name: a reader can miss it only between two renames.
  const previous = `${outDir}.previous-${process.pid}`;
  fs.rmSync(previous, { recursive: true, force: true });
  if (fs.existsSync(outDir)) fs.renameSync(outDir, previous);
  fs.renameSync(staging, outDir);
  fs.rmSync(previous, { recursive: true, force: true });
  return ["index.html", ...outputs];
}
