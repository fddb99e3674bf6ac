import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";

const root = path.resolve(import.meta.dirname, "../..");
const BUILDING = "typesafe: building dist/ from src/";

/**
 * `npm install` builds (the `prepare` script) and makes a fresh embedded
 * store, so the first `npm start` of a fresh clone only starts; when a build is still needed, `npm start` says so
 * before it and says when each step is done, and says nothing when dist/ is
 * fresh. A scratch copy holds the real start.mjs, build.mjs and the account
 * page's bundler with a one-module server and a one-line page: cheap, and the
 * build's errors are esbuild's own. stdout and stderr go to one file, so the
 * order of the lines is the order they were written.
 */
let scratch: string;
const prepareScript = (JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf8")) as { scripts: Record<string, string> }).scripts.prepare;

beforeAll(() => {
  scratch = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-start-line-"));
  fs.mkdirSync(path.join(scratch, "src", "web", "page"), { recursive: true });
  fs.mkdirSync(path.join(scratch, "src", "admin"));
  for (const file of ["start.mjs", "build.mjs", "web/bundle-account-page.mjs"]) {
    fs.copyFileSync(path.join(root, "src", file), path.join(scratch, "src", file));
  }
  fs.symlinkSync(path.join(root, "node_modules"), path.join(scratch, "node_modules"));
  // No `dependencies`: `npm run` never installs or prunes, so the linked node_modules is only read.
  fs.writeFileSync(path.join(scratch, "package.json"), JSON.stringify({ name: "scratch", private: true, type: "module", scripts: { prepare: prepareScript } }));
  fs.writeFileSync(path.join(scratch, "tsconfig.json"), JSON.stringify({ compilerOptions: { target: "ES2022", verbatimModuleSyntax: true } }));
  fs.writeFileSync(path.join(scratch, "src", "main.ts"), "import { said } from './said.js';\nconsole.log(said satisfies string);\n");
  fs.writeFileSync(path.join(scratch, "src", "said.ts"), "export const said: string = 'the server runs';\n");
  fs.writeFileSync(path.join(scratch, "src", "admin", "cli.ts"), "const said: string = 'the CLI runs';\nconsole.log(said);\n");
  fs.writeFileSync(path.join(scratch, "src", "web", "page", "app.ts"), "document.title = 'account';\n");
  fs.writeFileSync(path.join(scratch, "src", "web", "page", "app.css"), "body { margin: 0 }\n");
  fs.writeFileSync(path.join(scratch, "src", "web", "page", "index.html"), '<link rel="stylesheet" href="./app.css"><script type="module" src="./app.js"></script>\n');
});

afterAll(() => fs.rmSync(scratch, { recursive: true, force: true }));

function run(command: string, args: string[]): { status: number | null; lines: string[] } {
  const out = path.join(scratch, "out.txt");
  const fd = fs.openSync(out, "w");
  try {
    const { status } = spawnSync(command, args, { cwd: scratch, stdio: ["ignore", fd, fd] });
    return { status, lines: fs.readFileSync(out, "utf8").split("\n").filter((l) => l !== "") };
  } finally {
    fs.closeSync(fd);
  }
}
const start = () => run(process.execPath, ["src/start.mjs"]);

it("`npm install` runs the build: the prepare script builds dist/ when it is stale (npm runs `prepare` on a local install without arguments)", () => {
  expect(prepareScript).toBe("node src/build.mjs --if-stale");
  const { status, lines } = run("npm", ["run", "--silent", "prepare"]);
  expect(status).toBe(0);
  expect(lines[0]).toBe(`${BUILDING} (first build; a few seconds)`);
  expect(fs.existsSync(path.join(scratch, "dist", ".built"))).toBe(true);
  // Every module on its own (the store's worker loads them), and the server and the operator CLI as one bundle each.
  expect(fs.readFileSync(path.join(scratch, "dist", "said.js"), "utf8")).toContain("the server runs");
  expect(fs.readFileSync(path.join(scratch, "dist", "bundle", "main.mjs"), "utf8")).toContain("the server runs");
  expect(fs.readFileSync(path.join(scratch, "dist", "bundle", "admin.mjs"), "utf8")).toContain("the CLI runs");
  // And a fresh embedded store, which a first start copies instead of running PGlite's initdb.
  expect(lines.at(-1)).toMatch(/^typesafe: made a fresh embedded store for first starts \(\d+\.\d s\)$/);
  expect(fs.readFileSync(path.join(scratch, "dist", "store-template", "PG_VERSION"), "utf8").trim()).toMatch(/^\d+$/);
}, 120_000);

it("a fresh build: no line, the server runs at once", () => {
  const { status, lines } = start();
  expect(lines).toEqual(["the server runs"]);
  expect(status).toBe(0);
});

it("a changed source: the line comes first, then each step with its time, then the server", () => {
  const later = new Date(Date.now() + 60_000);
  fs.utimesSync(path.join(scratch, "src", "said.ts"), later, later);
  const { status, lines } = start();
  expect(lines).toEqual([
    `${BUILDING} (a source changed; a few seconds)`,
    expect.stringMatching(/^typesafe: compiled 3 modules \(\d+\.\d s\)$/),
    expect.stringMatching(/^typesafe: bundled the server \(\d+\.\d s\)$/),
    expect.stringMatching(/^typesafe: bundled the operator CLI \(\d+\.\d s\)$/),
    expect.stringMatching(/^typesafe: bundled the account page \(\d+\.\d s\)$/),
    expect.stringMatching(/^typesafe: built in \d+\.\d s$/),
    "the server runs",
  ]);
  expect(status).toBe(0);
});

it("a broken source: the line comes first, then the error naming the file, and the server does not start", () => {
  fs.writeFileSync(path.join(scratch, "src", "broken.ts"), "export const port: number = ;\n");
  const later = new Date(Date.now() + 120_000);
  fs.utimesSync(path.join(scratch, "src", "broken.ts"), later, later);
  const { status, lines } = start();
  expect(lines[0]).toBe(`${BUILDING} (a source changed; a few seconds)`);
  expect(lines.join("\n")).toMatch(/src\/broken\.ts:1:\d+/);
  expect(lines.at(-1)).toBe("typesafe: the build failed; the errors are above");
  expect(lines).not.toContain("the server runs");
  expect(status).not.toBe(0);
});
