import fs from "node:fs/promises";
import path from "node:path";
import { describe, expect, it } from "vitest";

/**
 * Only src/config.ts reads the environment: every setting is parsed and
 * checked in one place, and nothing changes behaviour behind its back. The
 * import rules (dependency-cruiser) cannot see a property read, so this test
 * reads the sources.
 */

const SRC = path.resolve(import.meta.dirname, "../../src");
const READER = "config.ts";

/** A read of the environment: `process.env`, `process["env"]`, or `env` taken from node:process. */
const ENVIRONMENT_READ = /\bprocess\s*(?:\?\.|\.)\s*env\b|\bprocess\s*\[\s*["'`]env["'`]\s*\]|\{[^}]*\benv\b[^}]*\}\s*from\s*["'](?:node:)?process["']/;

async function sourceFiles(dir: string): Promise<string[]> {
  const entries = await fs.readdir(dir, { withFileTypes: true, recursive: true });
  return entries
    .filter((entry) => entry.isFile() && /\.(?:ts|mts|cts|js|mjs|cjs)$/.test(entry.name))
    .map((entry) => path.relative(SRC, path.join(entry.parentPath, entry.name)).split(path.sep).join("/"))
    .sort();
}

describe("only config.ts reads the environment", () => {
  it.each([
    ["const port = process.env.PORT;", true],
    ["const port = process.env['PORT'];", true],
    ["const { PORT } = process.env;", true],
    ["const port = process?.env?.PORT;", true],
    ['const env = process["env"];', true],
    ['import { env } from "node:process";', true],
    ['import { argv, env } from "process";', true],
    ["const pid = process.pid;", false],
    ["const environment = options.env;", false],
    ['import { argv } from "node:process";', false],
  ])("%j is a read: %s", (line, isRead) => {
    expect(ENVIRONMENT_READ.test(line)).toBe(isRead);
  });

  it("no other file of src/ reads it", async () => {
    const files = await sourceFiles(SRC);
    expect(files).toContain(READER);
    const readers: string[] = [];
    for (const file of files) {
      if (ENVIRONMENT_READ.test(await fs.readFile(path.join(SRC, file), "utf8"))) readers.push(file);
    }
    expect(readers).toEqual([READER]);
  });
});
