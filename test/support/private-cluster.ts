import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";

/** A throwaway PostgreSQL cluster of its own, so stopping or crashing it disturbs nobody else. */
export interface PrivateCluster {
  url: string;
  /** The data directory, owned by the postgres user when run as root. */
  dir: string;
  /**
   * `pg_ctl stop -m immediate`, then a start: the postmaster and its children
   * quit at once without writing out WAL buffers, as after `kill -9`, and the
   * start recovers from the WAL on disk. Durable commits survive it; a commit
   * made with `synchronous_commit = off` survives only if the WAL writer or a
   * later durable commit wrote it out first.
   */
  crash(): void;
  stop(): void;
}

/** Debian's PostgreSQL server binaries (postgresql-NN), or undefined where initdb is not installed. */
export function postgresBinaries(): string | undefined {
  const root = "/usr/lib/postgresql";
  const versions = fs.existsSync(root) ? fs.readdirSync(root) : [];
  return versions.map((v) => `${root}/${v}/bin`).find((bin) => fs.existsSync(`${bin}/initdb`));
}

const asRoot = process.getuid?.() === 0;

/**
 * Runs a server binary as a private cluster's owner: as root that is the
 * postgres user, since initdb refuses root. Feeds it `input`, throws with its
 * stderr when it fails, and returns its stderr (valgrind reports there).
 */
export function runAsClusterOwner(command: string, args: string[], input = ""): string {
  const [file, argv] = asRoot ? ["runuser", ["-u", "postgres", "--", command, ...args]] : [command, args];
  const result = spawnSync(file, argv, { input, encoding: "utf8", maxBuffer: 64 * 1024 * 1024 });
  if (result.status !== 0) throw new Error(`${command} ${args.join(" ")} exited with ${result.status}:\n${result.stderr}`);
  return result.stderr;
}

/**
 * initdb in a temp folder and a server on a free loopback port. `settings`
 * become `-c name=value` options (e.g. `wal_writer_delay: "10s"`). The
 * cluster belongs to runAsClusterOwner's user.
 */
export async function startPrivateCluster(settings: Record<string, string> = {}): Promise<PrivateCluster> {
  const bin = postgresBinaries();
  if (!bin) throw new Error("no PostgreSQL server binaries under /usr/lib/postgresql (Debian's postgresql package)");
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-pg-"));
  try {
    if (asRoot) execFileSync("chown", ["postgres", dir]);
    runAsClusterOwner(`${bin}/initdb`, ["-D", dir, "-A", "trust", "-U", "postgres"]);
    const port = await freePort();
    const extra = Object.entries(settings).map(([name, value]) => `-c ${name}=${value}`);
    const options = [`-p ${port}`, `-k ${dir}`, "-c listen_addresses=127.0.0.1", "-c fsync=off", ...extra].join(" ");
    const start = () => runAsClusterOwner(`${bin}/pg_ctl`, ["-D", dir, "-o", options, "-w", "-l", `${dir}/log`, "start"]);
    start();
    return {
      url: `postgres://postgres@127.0.0.1:${port}/postgres`,
      dir,
      crash: () => {
        runAsClusterOwner(`${bin}/pg_ctl`, ["-D", dir, "-m", "immediate", "-w", "stop"]);
        start();
      },
      stop: () => {
        runAsClusterOwner(`${bin}/pg_ctl`, ["-D", dir, "-m", "immediate", "-w", "stop"]);
        fs.rmSync(dir, { recursive: true, force: true, maxRetries: 5 });
      },
    };
  } catch (err) {
    fs.rmSync(dir, { recursive: true, force: true });
    throw err;
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const server = net.createServer().listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}
