import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";

/**
 * The pages name files and commands that must exist: a path in backquotes
 * (`src/db/embedded.ts`, or `rpc/adapter.ts` inside src/, or a folder such as
 * `upstream/`) is a file or folder of the repository, and every `npm run X`,
 * in the pages and in the code's comments, is a script of package.json. Paths
 * with placeholders (`<id>`, `*`) and absolute paths are not checked.
 */
const root = path.resolve(import.meta.dirname, "../..");
const read = (file: string) => fs.readFileSync(path.join(root, file), "utf8");
const tracked = execFileSync("git", ["ls-files"], { cwd: root, encoding: "utf8" })
  .split("\n")
  .filter((file) => file !== "" && fs.existsSync(path.join(root, file)));

/** What the commands write (build output, reports, downloads): named in the pages, never committed. */
const OUTPUTS = ["dist/", "reports/", "usage.csv"];

function pages(): string[] {
  return tracked.filter((file) => file === "README.md" || /^docs\/[^/]+\.md$/.test(file) || /^examples\/.*README\.md$/.test(file));
}

const FILE_NAME = /\.(ts|mjs|cjs|js|md|json|sql|proto|ya?ml|sh|py|go|png|html|css)$/;

/** Backquoted words that name a file or folder: a file name with an extension, or a path ending in `/`. */
function namedPaths(markdown: string): string[] {
  return [...markdown.matchAll(/`([^`\s]+)`/g)]
    .map((m) => m[1]!)
    .filter((word) => !/[<>*{}$:@]/.test(word) && !word.startsWith("/") && (FILE_NAME.test(word) || (word.endsWith("/") && word.length > 1)));
}

/** A path names a file of the repository, or one seen from any folder (`rpc/adapter.ts` is src/rpc/adapter.ts). */
function exists(named: string): boolean {
  const clean = named.replace(/^\.\//, "");
  if (OUTPUTS.some((output) => clean === output || clean.startsWith(output))) return true;
  return clean.endsWith("/")
    ? tracked.some((file) => file.startsWith(clean) || file.includes(`/${clean}`))
    : tracked.some((file) => file === clean || file.endsWith(`/${clean}`));
}

describe("files the pages name", () => {
  it.each(pages())("%s: every path in backquotes exists", (page) => {
    expect(namedPaths(read(page)).filter((named) => !exists(named))).toEqual([]);
  });

  it("the check finds a file that is gone, and passes one seen from its folder", () => {
    expect(namedPaths("see `src/gone/away.ts`, `rpc/adapter.ts`, `upstream/`, `src/search/sources/<id>.ts` and `/usr/bin/chromium`")).toEqual([
      "src/gone/away.ts",
      "rpc/adapter.ts",
      "upstream/",
    ]);
    expect(["src/gone/away.ts", "rpc/adapter.ts", "upstream/", "gone/"].map(exists)).toEqual([false, true, true, false]);
  });
});

describe("npm scripts named", () => {
  const scripts = Object.keys(JSON.parse(read("package.json")).scripts as Record<string, string>);
  const named = (text: string) => [...text.matchAll(/npm run (?:--silent |-s )?([a-z][\w-]*(?::[\w-]+)*)/g)].map((m) => m[1]!);

  it("every `npm run X` in the pages, the code, the tests and CI is a script of package.json", () => {
    const files = tracked.filter((file) => (/\.(ts|mjs|cjs|md|json|sh)$/.test(file) && !file.startsWith("src/gen/")) || file === ".ci/run");
    const missing = files.flatMap((file) => named(read(file)).filter((script) => !scripts.includes(script)).map((script) => `${file}: npm run ${script}`));
    expect(missing).toEqual([]);
  });

  it("the check reads the script's name, not the words after it", () => {
    expect(named("`npm run docs:generate` rewrites; npm run --silent admin -- x; npm run mutate: which")).toEqual(["docs:generate", "admin", "mutate"]);
  });
});
