import fs from "node:fs/promises";
import path from "node:path";

/** Who holds an embedded store's folder. */
export interface StoreOwner {
  pid: number;
  /** The process's start time as the kernel counts it, so a reused pid is not taken for the owner. */
  startedAt: string;
}

/** A second process tried to open a folder whose owner is alive. */
export class StoreInUseError extends Error {
  constructor(
    readonly dataDir: string,
    readonly owner: StoreOwner,
    ownerUrl: string | undefined,
  ) {
    const where = ownerUrl ? `, its database on ${new URL(ownerUrl).host}` : "";
    super(
      `the embedded store in ${dataDir} is in use by process ${owner.pid}${where}; ` +
        "stop that process first, or set TYPESAFE_DATA_DIR to another folder (the operator CLI reaches a running service's store by itself)",
    );
    this.name = "StoreInUseError";
  }
}

export interface StoreLock {
  /** Removes the lock file, if it is still ours. */
  release(): Promise<void>;
}

const LOCK_FILE = "owner.lock";

/**
 * Makes this process the only owner of an embedded store's folder: PGlite's
 * files must never be opened by two processes, and a process that failed to
 * open them must not delete what the live owner wrote. The lock file holds the
 * owner's pid and start time; a lock whose process is gone (or whose pid now
 * belongs to another process) is stale and taken over.
 */
export async function lockStore(dataDir: string, readOwnerUrl: () => Promise<string | undefined>): Promise<StoreLock> {
  const lockPath = path.join(dataDir, LOCK_FILE);
  const me: StoreOwner = { pid: process.pid, startedAt: await startTimeOf(process.pid) ?? "unknown" };
  const mine = JSON.stringify(me);
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      await fs.writeFile(lockPath, mine, { flag: "wx", mode: 0o600 });
      return {
        release: async () => {
          if ((await fs.readFile(lockPath, "utf8").catch(() => undefined)) === mine) await fs.rm(lockPath, { force: true });
        },
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
    const owner = await readOwner(lockPath);
    if (owner && (await isAlive(owner))) throw new StoreInUseError(dataDir, owner, await readOwnerUrl());
    // Stale: its process is gone. Remove it and try again (another starter may win the race; then it is alive).
    await fs.rm(lockPath, { force: true });
  }
  throw new Error(`could not take the lock ${lockPath}: other processes keep taking it`);
}

async function readOwner(lockPath: string): Promise<StoreOwner | undefined> {
  try {
    const owner = JSON.parse(await fs.readFile(lockPath, "utf8")) as Partial<StoreOwner>;
    if (typeof owner.pid === "number" && Number.isInteger(owner.pid) && owner.pid > 0 && typeof owner.startedAt === "string") {
      return { pid: owner.pid, startedAt: owner.startedAt };
    }
  } catch {
    // An unreadable or half-written lock: treated as stale.
  }
  return undefined;
}

async function isAlive(owner: StoreOwner): Promise<boolean> {
  try {
    process.kill(owner.pid, 0);
  } catch (err) {
    // EPERM: the process exists but belongs to someone else.
    if ((err as NodeJS.ErrnoException).code !== "EPERM") return false;
  }
  const startedAt = await startTimeOf(owner.pid);
  return startedAt === undefined || owner.startedAt === "unknown" || startedAt === owner.startedAt;
}

/** Field 22 of /proc/<pid>/stat (start time in clock ticks since boot); undefined where /proc is missing. */
async function startTimeOf(pid: number): Promise<string | undefined> {
  try {
    const stat = await fs.readFile(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) may hold spaces and parentheses: count fields after its closing ")".
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
  } catch {
    return undefined;
  }
}
