import { spawn } from "node:child_process";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import pg from "pg";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { socketFilePath } from "../../src/db/published-socket.js";
import { openEmbeddedStore } from "../../src/db/embedded.js";
import { createLogger } from "../../src/logger.js";

// The store runs PGlite on a thread of its own (src/db/embedded-worker.ts); these pin what its owner sees.
let dataDir: string;
const silent = createLogger("silent");

beforeEach(async () => {
  dataDir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-embedded-"));
});
afterEach(async () => {
  await fs.rm(dataDir, { recursive: true, force: true });
});

async function query(url: string, sql: string): Promise<pg.QueryResult> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return await client.query(sql);
  } finally {
    await client.end();
  }
}

describe("the embedded store's thread", () => {
  it("refuses a folder PGlite cannot open with PGlite's reason, and releases the folder's lock", async () => {
    // A data folder of another PostgreSQL major version: PGlite's start-up refuses it.
    await fs.writeFile(path.join(dataDir, "PG_VERSION"), "9\n");
    await expect(openEmbeddedStore(dataDir, silent)).rejects.toThrow(/PGlite failed to initialize/);
    expect(await fs.readdir(dataDir)).toEqual(["PG_VERSION"]);
    // Not "in use by process …": the failed attempt left no owner behind.
    await expect(openEmbeddedStore(dataDir, silent)).rejects.toThrow(/PGlite failed to initialize/);
  });

  it("closes for good: the address stops answering, the published address goes, and the folder reopens with its data", async () => {
    const store = await openEmbeddedStore(dataDir, silent);
    await query(store.url, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (41), (42)");
    expect(JSON.parse(await fs.readFile(socketFilePath(dataDir), "utf8"))).toMatchObject({ url: store.url, pid: process.pid });

    await store.close();
    await expect(fs.access(socketFilePath(dataDir))).rejects.toThrow();
    await expect(query(store.url, "SELECT 1")).rejects.toThrow(/ECONNREFUSED/);

    const reopened = await openEmbeddedStore(dataDir, silent);
    try {
      expect(reopened.url).not.toBe(store.url); // a new password at each start
      expect((await query(reopened.url, "SELECT n FROM kept ORDER BY n")).rows).toEqual([{ n: 41 }, { n: 42 }]);
    } finally {
      await reopened.close();
    }
  });
});

describe("a store whose thread dies", () => {
  /** Runs test/support/dying-store-thread.ts; its exit status and its log lines. */
  function runDyingThread(...args: string[]): Promise<{ status: number | null; lines: Array<Record<string, unknown>> }> {
    const child = spawn(process.execPath, ["--import", "tsx", "test/support/dying-store-thread.ts", ...args], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
    return new Promise((resolve) =>
      child.on("exit", (status) => resolve({ status, lines: out.trim().split("\n").filter(Boolean).map((line) => JSON.parse(line) as Record<string, unknown>) })),
    );
  }

  it("exits the process with status 1, after logging which store stopped and how", async () => {
    const { status, lines } = await runDyingThread("exit");
    expect(status).toBe(1);
    expect(lines).toEqual([expect.objectContaining({ level: "error", msg: "embedded database stopped", data_dir: "/srv/typesafe-data", exit_code: 7 })]);
  });

  it("logs the thread's uncaught error before it exits", async () => {
    const { status, lines } = await runDyingThread("throw");
    expect(status).toBe(1);
    expect(lines.map((line) => line.msg)).toEqual(["embedded database failed", "embedded database stopped"]);
    expect(JSON.stringify(lines[0])).toContain("PGlite aborted");
  });

  it("lets a store being closed end its thread quietly", async () => {
    const { status, lines } = await runDyingThread("exit", "closing");
    expect(status).toBe(0);
    expect(lines).toEqual([]);
  });
});
