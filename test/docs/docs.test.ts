import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { SETTING_MEANINGS } from "../../src/config.js";
import { AccountService } from "../../src/gen/typesafe/account/v1/account_service_pb.js";
import { renderErrorTable } from "./error-table.js";
import { pagesWithRegions, regenerate, settingsRead } from "./generated.js";

/**
 * The README and docs/ stay true to the code: the README is short, prints the
 * error table of src/errors.ts, and every relative link (file and heading)
 * reaches something that exists.
 */
const root = path.resolve(import.meta.dirname, "../..");
const read = (file: string) => fs.readFileSync(path.join(root, file), "utf8");

/** The Markdown pages a reader opens: the README, docs/ and the examples' READMEs. */
function pages(): string[] {
  const docs = fs.readdirSync(path.join(root, "docs")).filter((f) => f.endsWith(".md")).map((f) => `docs/${f}`);
  const examples = fs
    .readdirSync(path.join(root, "examples"), { recursive: true, encoding: "utf8" })
    .filter((f) => path.basename(f) === "README.md")
    .map((f) => `examples/${f}`);
  return ["README.md", ...docs, ...examples];
}

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens. */
function anchorOf(heading: string): string {
  return heading.trim().toLowerCase().replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, "").replace(/ /g, "-");
}

function anchorsOf(markdown: string): Set<string> {
  const withoutCode = markdown.replace(/```[\s\S]*?```/g, "");
  return new Set([...withoutCode.matchAll(/^#{1,6} (.+)$/gm)].map((m) => anchorOf(m[1]!)));
}

/** Relative links `[text](target)` outside code blocks; web links are left to their owners. */
function relativeLinks(markdown: string): string[] {
  const withoutCode = markdown.replace(/```[\s\S]*?```/g, "").replace(/`[^`\n]*`/g, "");
  return [...withoutCode.matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1]!).filter((target) => !/^[a-z]+:/.test(target));
}

describe("README.md", () => {
  it("stays short", () => {
    expect(read("README.md").split("\n").length).toBeLessThanOrEqual(200);
  });

  it("prints the error table of src/errors.ts, one row per reason", () => {
    expect(read("README.md")).toContain(renderErrorTable());
  });
});

describe("the tables made from the code (npm run docs:generate)", () => {
  it("the settings, metrics, errors and search sources tables are there", () => {
    expect(pagesWithRegions()).toEqual(expect.arrayContaining(["README.md", "docs/operating.md", "docs/decisions.md", "docs/search.md"]));
    expect(read("docs/operating.md")).toMatch(/<!-- generated: settings [^\n]*-->[\s\S]*<!-- generated: metrics -->/);
    expect(read("docs/search.md")).toMatch(/<!-- generated: sources -->[\s\S]*<!-- generated: settings only=TYPESAFE_SEARCH_ -->/);
  });

  it.each(pagesWithRegions())("%s: every generated region is fresh (else run npm run docs:generate)", async (page) => {
    expect(await regenerate(read(page))).toBe(read(page));
  });

  it("every variable src/config.ts reads has a meaning in SETTING_MEANINGS, and every meaning names a variable it reads", () => {
    const read = settingsRead().map((s) => s.name);
    expect(read.filter((name) => !(name in SETTING_MEANINGS))).toEqual([]);
    expect(Object.keys(SETTING_MEANINGS).filter((name) => !read.includes(name))).toEqual([]);
  });
});

describe("docs/account-area.md", () => {
  it("its table of the API names every RPC of the AccountService", () => {
    const section = read("docs/account-area.md").split("## The API behind it")[1]!.split("\n## ")[0]!;
    const table = section.split("\n").filter((line) => line.startsWith("| `")).join("\n");
    expect(AccountService.methods.map((m) => m.name).filter((name) => !table.includes(`\`${name}\``))).toEqual([]);
  });
});

describe("links between the pages", () => {
  it.each(pages())("%s: every relative link reaches a file, and its heading when it names one", (page) => {
    const broken: string[] = [];
    for (const link of relativeLinks(read(page))) {
      const [target, anchor] = link.split("#") as [string, string | undefined];
      const file = target === "" ? page : path.posix.normalize(path.posix.join(path.posix.dirname(page), target));
      if (!fs.existsSync(path.join(root, file))) {
        broken.push(`${link}: no ${file}`);
        continue;
      }
      if (anchor !== undefined && file.endsWith(".md") && !anchorsOf(read(file)).has(anchor)) {
        broken.push(`${link}: no heading #${anchor} in ${file}`);
      }
    }
    expect(broken).toEqual([]);
  });
});

describe("shell commands in the pages", () => {
  /**
   * Every sh block says how it is kept true, on the line before it:
   * `<!-- run by test/….test.ts -->`, a test that runs it and names the page,
   * or `<!-- not run: the reason -->`.
   */
  it.each(pages())("%s: every sh block is run by a named test or says why not", (page) => {
    const text = read(page);
    const problems: string[] = [];
    for (const match of text.matchAll(/(?:^|\n)(.*)\n *```sh\n/g)) {
      const marker = /^ *<!-- (run by (test\/\S+\.test\.ts)|not run: .+) -->$/.exec(match[1]!);
      const line = text.slice(0, match.index).split("\n").length + 1;
      if (!marker) {
        problems.push(`line ${line}: no <!-- run by … --> or <!-- not run: … --> before the block`);
        continue;
      }
      const testFile = marker[2];
      if (testFile === undefined) continue;
      if (!fs.existsSync(path.join(root, testFile))) problems.push(`line ${line}: ${testFile} does not exist`);
      else if (!read(testFile).includes(page.endsWith("/README.md") && page !== "README.md" ? path.dirname(page) : page)) {
        problems.push(`line ${line}: ${testFile} never names ${page}`);
      }
    }
    expect(problems).toEqual([]);
  });
});

describe("docs/development.md: how CI runs", () => {
  /** The numbered steps under "## How CI runs". */
  const steps = () => read("docs/development.md").split("## How CI runs")[1]!.split("\n## ")[0]!;

  it("names every suite .ci/run runs and every Debian package it installs outside the polyglot list", () => {
    const ci = read(".ci/run");
    const suites = [...ci.matchAll(/^\s*(?:env -u DATABASE_URL )?(npm (?:test|run (?:--silent )?[\w:-]+))/gm)].map((m) => m[1]!.replace("--silent ", ""));
    const packages = [...ci.matchAll(/^if ! installed ([\w.-]+);/gm)].map((m) => m[1]!);
    expect(suites).toEqual(expect.arrayContaining(["npm test", "npm run test:upgrade", "npm run test:failover"]));
    expect(packages.length).toBeGreaterThan(0);
    expect([...suites, ...packages].filter((name) => !steps().includes(name))).toEqual([]);
  });
});
