import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { seedStore } from "../../src/db/embedded.js";
import { createLogger } from "../../src/logger.js";

/**
 * A first start copies the fresh store the install made instead of running
 * PGlite's initdb. These folders stand in for the template's layout; that
 * PGlite opens a real copy is shown by `npm start` (test/ops/start-command.test.ts),
 * whose install made the template.
 */
let dir: string;
let template: string;
let dataDir: string;
const logger = createLogger("silent");

beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-seed-"));
  template = path.join(dir, "store-template");
  dataDir = path.join(dir, "data");
  fs.mkdirSync(path.join(template, "base", "1"), { recursive: true });
  fs.writeFileSync(path.join(template, "base", "1", "1259"), "catalog");
  fs.writeFileSync(path.join(template, "postgresql.conf"), "# template\n");
  fs.writeFileSync(path.join(template, "PG_VERSION"), "17\n");
  fs.writeFileSync(path.join(template, ".pglite-version"), "0.5.14");
  fs.mkdirSync(path.join(dataDir, "models"), { recursive: true });
  fs.writeFileSync(path.join(dataDir, "models", "m.gguf"), "model");
});
afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

it("copies the template into a folder with no store, next to what the folder already holds", async () => {
  // What an earlier start cut short during its own initdb left behind.
  fs.writeFileSync(path.join(dataDir, "postgresql.conf"), "# half written\n");
  expect(await seedStore(dataDir, template, logger)).toBe(true);
  expect(fs.readdirSync(dataDir).sort()).toEqual(["PG_VERSION", "base", "models", "postgresql.conf"]);
  expect(fs.readFileSync(path.join(dataDir, "base", "1", "1259"), "utf8")).toBe("catalog");
  expect(fs.readFileSync(path.join(dataDir, "postgresql.conf"), "utf8")).toBe("# template\n");
  expect(fs.readFileSync(path.join(dataDir, "models", "m.gguf"), "utf8")).toBe("model");
});

it("leaves a folder that holds a store alone", async () => {
  fs.writeFileSync(path.join(dataDir, "PG_VERSION"), "17\n");
  fs.writeFileSync(path.join(dataDir, "postgresql.conf"), "# the operator's\n");
  expect(await seedStore(dataDir, template, logger)).toBe(false);
  expect(fs.readFileSync(path.join(dataDir, "postgresql.conf"), "utf8")).toBe("# the operator's\n");
  expect(fs.existsSync(path.join(dataDir, "base"))).toBe(false);
});

it("does nothing without a template (run from the sources, or an install that could not make one)", async () => {
  expect(await seedStore(dataDir, path.join(dir, "none"), logger)).toBe(false);
  expect(fs.readdirSync(dataDir)).toEqual(["models"]);
});
