import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";

const root = path.resolve(import.meta.dirname, "../..");
const BUILDING = "typesafe: building dist/ from src/";

/**
 * `npm start` says it is building before the seconds a compilation takes, and
 * says nothing when dist/ is fresh. A scratch copy holds the real start.mjs and
 * build.mjs with a one-file project for the real tsc, which fails on a type
 * error: cheap, and its error is the build's own output. stdout and stderr go
 * to one file, so the order of the lines is the order they were written.
 */
let scratch: string;

beforeAll(() => {
  scratch = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-start-line-"));
  fs.mkdirSync(path.join(scratch, "src", "web"), { recursive: true });
  for (const file of ["start.mjs", "build.mjs", "web/bundle-account-page.mjs"]) {
    fs.copyFileSync(path.join(root, "src", file), path.join(scratch, "src", file));
  }
  fs.symlinkSync(path.join(root, "node_modules"), path.join(scratch, "node_modules"));
  fs.writeFileSync(path.join(scratch, "tsconfig.build.json"), JSON.stringify({ compilerOptions: { strict: true, noEmit: true, types: [], lib: ["es2022"], skipLibCheck: true }, files: ["src/broken.ts"] }));
  fs.writeFileSync(path.join(scratch, "src", "broken.ts"), "export const port: number = 'eighty';\n");
  fs.mkdirSync(path.join(scratch, "dist", "bundle"), { recursive: true });
  fs.writeFileSync(path.join(scratch, "dist", "bundle", "main.mjs"), "console.log('the server runs');\n");
});

afterAll(() => fs.rmSync(scratch, { recursive: true, force: true }));

function start(): { status: number | null; lines: string[] } {
  const out = path.join(scratch, "out.txt");
  const fd = fs.openSync(out, "w");
  try {
    const { status } = spawnSync(process.execPath, ["src/start.mjs"], { cwd: scratch, stdio: ["ignore", fd, fd] });
    return { status, lines: fs.readFileSync(out, "utf8").split("\n").filter((l) => l !== "") };
  } finally {
    fs.closeSync(fd);
  }
}

it("a stale build: the line comes first, then the compiler's output, and the server does not start", () => {
  fs.rmSync(path.join(scratch, "dist", ".built"), { force: true });
  const { status, lines } = start();
  expect(lines[0]).toContain(BUILDING);
  expect(lines.slice(1).join("\n")).toMatch(/src\/broken\.ts.*error TS2322/);
  expect(lines).not.toContain("the server runs");
  expect(status).not.toBe(0);
});

it("a fresh build: no line, the server runs at once", () => {
  const stamp = path.join(scratch, "dist", ".built");
  fs.writeFileSync(stamp, "");
  const later = new Date(Date.now() + 60_000);
  fs.utimesSync(stamp, later, later);
  const { status, lines } = start();
  expect(lines).toEqual(["the server runs"]);
  expect(status).toBe(0);
});
