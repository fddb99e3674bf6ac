import { spawn } from "node:child_process";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { lockStore, StoreInUseError } from "../../src/db/store-lock.js";

let dataDir: string;
const lockFile = () => path.join(dataDir, "owner.lock");
const noUrl = async () => undefined;

beforeEach(async () => {
  dataDir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-lock-"));
});
afterEach(async () => {
  await fs.rm(dataDir, { recursive: true, force: true });
});

/** The pid of a process that has exited: a stale owner. */
async function exitedPid(): Promise<number> {
  const child = spawn(process.execPath, ["-e", ""]);
  await new Promise((resolve) => child.on("exit", resolve));
  return child.pid!;
}

describe("the embedded store's owner lock", () => {
  it("refuses a second owner while the first is alive, naming its pid and its database address", async () => {
    const first = await lockStore(dataDir, noUrl);
    const refused = await lockStore(dataDir, async () => "postgres://typesafe@127.0.0.1:45678/postgres").catch((err: unknown) => err);
    expect(refused).toBeInstanceOf(StoreInUseError);
    expect((refused as Error).message).toContain(`in use by process ${process.pid}, its database on 127.0.0.1:45678`);
    await first.release();
    const second = await lockStore(dataDir, noUrl);
    await second.release();
  });

  it("takes over a lock whose process is gone", async () => {
    await fs.writeFile(lockFile(), JSON.stringify({ pid: await exitedPid(), startedAt: "1" }));
    const lock = await lockStore(dataDir, noUrl);
    expect(JSON.parse(await fs.readFile(lockFile(), "utf8"))).toMatchObject({ pid: process.pid });
    await lock.release();
  });

  it("takes over a lock whose pid now belongs to another process (a different start time)", async () => {
    await fs.writeFile(lockFile(), JSON.stringify({ pid: process.pid, startedAt: "0" }));
    const lock = await lockStore(dataDir, noUrl);
    await lock.release();
    await expect(fs.access(lockFile())).rejects.toThrow();
  });

  it("takes over an unreadable lock", async () => {
    await fs.writeFile(lockFile(), "{half");
    const lock = await lockStore(dataDir, noUrl);
    await lock.release();
  });

  it("release never removes a lock it does not own", async () => {
    const lock = await lockStore(dataDir, noUrl);
    const someoneElse = JSON.stringify({ pid: 1, startedAt: "5" });
    await fs.writeFile(lockFile(), someoneElse);
    await lock.release();
    expect(await fs.readFile(lockFile(), "utf8")).toBe(someoneElse);
  });
});
