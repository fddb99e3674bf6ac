/**
 * The processes a bench runs apart, as users run them: the service itself
 * (`node dist/bundle/main.mjs` with `npm start`'s node options, what `npm start` runs), the fake upstream, the bare
 * `node:http` baseline and the load generator, each in a process of its own
 * so none of them takes CPU from another's event loop. The parent only
 * orchestrates; children are driven over IPC. Loopback only.
 */
import { fork, spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import fs from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { LoadOptions, LoadResult } from "./roles.js";
import type { BareChainOptions } from "./support.js";

const ROLES = fileURLToPath(new URL("./roles.ts", import.meta.url));
const ROOT = fileURLToPath(new URL("..", import.meta.url));

/** The node options of a start script (`exec node --opt … src/start.mjs`): what node runs the service with. */
export function startNodeOptions(script: string): string[] {
  const match = /\bnode((?:\s+--\S+)*)\s+src\/start\.mjs\b/.exec(script);
  if (!match) throw new Error(`the start script does not run node on src/start.mjs: ${script}`);
  return match[1]!.split(/\s+/).filter(Boolean);
}

/** The node options `npm start` gives the service (package.json's start script), so a bench measures the heap a user runs. */
export const START_NODE_OPTIONS = startNodeOptions((JSON.parse(readFileSync(path.join(ROOT, "package.json"), "utf8")) as { scripts: { start: string } }).scripts.start);

/** A child running one of bench/roles.ts's roles, answering each message with one reply. */
async function startRole(role: string): Promise<{ child: ChildProcess; ask<T>(message: object): Promise<T>; first: unknown }> {
  const child = fork(ROLES, [role], { stdio: ["ignore", "inherit", "inherit", "ipc"] });
  const replies: Array<(value: unknown) => void> = [];
  child.on("message", (message) => replies.shift()?.(message));
  const next = () => new Promise<unknown>((resolve) => replies.push(resolve));
  const first = await next();
  return {
    child,
    first,
    ask: <T>(message: object) => {
      const reply = next() as Promise<T>;
      child.send(message);
      return reply;
    },
  };
}

async function stopRole(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  await exited;
}

/** The fake OpenAI-compatible upstream (bench/roles.ts), answering after `delayMs`. */
export async function startFakeUpstream() {
  const role = await startRole("--fake-upstream");
  return {
    url: (role.first as { url: string }).url,
    setDelay: (delayMs: number) => role.ask({ delayMs }),
    /** The URL and body of the last question the service sent it. */
    lastQuestion: async () => {
      const last = await role.ask<{ url: string; body: string } | { error: string }>({ lastQuestion: true });
      if ("error" in last) throw new Error(last.error);
      return last;
    },
    close: () => stopRole(role.child),
  };
}

/** A bare `node:http` server answering `body` to every request: the throughput and latency baseline. */
export async function startBareServer(body: string) {
  return startBare({ body });
}

/** A bare `node:http2` server answering every call with `message` as unary gRPC does: the gRPC row's baseline. */
export async function startBareGrpcServer(message: string) {
  return startBare({ grpcMessage: message });
}

/** The hops of a metered call and nothing else (bench/support.ts's startBareChain), in a process of its own. */
export async function startBareChain(chain: BareChainOptions) {
  return startBare({ chain });
}

async function startBare(message: object) {
  const role = await startRole("--bare");
  const answer = await role.ask<{ url: string } | { error: string }>(message);
  if ("error" in answer) {
    await stopRole(role.child);
    throw new Error(`the bare server could not start: ${answer.error}`);
  }
  return { url: answer.url, close: () => stopRole(role.child) };
}

/** The load generator: autocannon over HTTP, or concurrent unary calls over binary gRPC. */
export async function startLoadGenerator() {
  const role = await startRole("--load");
  return {
    run: async (options: LoadOptions): Promise<LoadResult> => {
      const result = await role.ask<LoadResult | { error: string }>(options);
      if ("error" in result) throw new Error(`load on ${options.url}: ${result.error}`);
      return result;
    },
    close: () => stopRole(role.child),
  };
}

/** A free loopback port (the service is told its port; it cannot report one it picked). */
export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

export interface ServiceProcess {
  url: string;
  pid: number;
  /** From spawn until /readyz first answered 200. */
  startMs: number;
  /** Peak resident memory so far (VmHWM), in MB. */
  peakRssMb(): Promise<number>;
  /** CPU time the service has used so far (user + system), in seconds: per-call cost that a busy machine's throughput hides. */
  cpuSeconds(): Promise<number>;
  stop(): Promise<void>;
}

/** Compiles src to dist if a source changed, as `npm start`'s prestart does. */
export async function buildService(): Promise<void> {
  await run(process.execPath, ["src/build.mjs", "--if-stale"]);
}

/**
 * The service with `env` on top of this process's, ready when /readyz
 * answers: `node dist/bundle/main.mjs` (what `npm start` runs; `bundle` names
 * another build of it), or `npm start` itself (`via: "npm"`, for the start
 * time a user sees; npm passes a SIGTERM on). Node runs it with `npm start`'s
 * options (START_NODE_OPTIONS), or `nodeOptions` instead; `nodeArgs` go to
 * node after them (e.g. `--cpu-prof`).
 */
export async function startService(
  env: Record<string, string>,
  options: { via?: "node" | "npm"; nodeOptions?: string[]; nodeArgs?: string[]; bundle?: string } = {},
): Promise<ServiceProcess> {
  const port = await freePort();
  const started = performance.now();
  const bundle = options.bundle ?? path.join(ROOT, "dist/bundle/main.mjs");
  const nodeArgs = [...(options.nodeOptions ?? START_NODE_OPTIONS), ...(options.nodeArgs ?? [])];
  const [command, args] = options.via === "npm" ? ["npm", ["start", "--silent"]] : [process.execPath, [...nodeArgs, bundle]];
  const child = spawn(command, args, {
    cwd: ROOT,
    env: { ...process.env, PORT: String(port), ...env },
    stdio: ["ignore", "ignore", "inherit"],
  });
  const url = `http://127.0.0.1:${port}`;
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  for (;;) {
    if (child.exitCode !== null) throw new Error(`the service exited with ${child.exitCode} before it was ready`);
    const ready = await fetch(`${url}/readyz`).then(
      (r) => r.status === 200,
      () => false,
    );
    if (ready) break;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  const startMs = performance.now() - started;
  return {
    url,
    pid: child.pid!,
    startMs,
    async peakRssMb() {
      const status = await fs.readFile(`/proc/${child.pid}/status`, "utf8");
      return Number(/VmHWM:\s+(\d+) kB/.exec(status)![1]) / 1024;
    },
    async cpuSeconds() {
      return (await processCpu(child.pid!)).seconds;
    },
    async stop() {
      if (child.exitCode !== null) return;
      child.kill("SIGTERM");
      await exited;
    },
  };
}

/** A process's name and the CPU time it has used (user + system), from /proc/<pid>/stat. */
async function processCpu(pid: number | string): Promise<{ name: string; seconds: number }> {
  const stat = await fs.readFile(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // utime and stime, fields 14 and 15 of proc(5), in clock ticks of 1/100 s on Linux.
  const ticks = (field: number) => Number(fields[field - 3]);
  return { name: stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")")), seconds: (ticks(14) + ticks(15)) / 100 };
}

/**
 * A reader of the CPU time used so far by the backends connected to one
 * database (their process title names it), in seconds; two readings around a
 * measure give the database's share of each call. Only that database's
 * backends: on a server other people's tests share, every PostgreSQL process
 * would count theirs too (the WAL writer's and checkpointer's share of ours is
 * left out with them). A backend that exits keeps the time last read of it, so
 * the figure never goes back, as it once did when a pool closed an idle
 * connection mid-measure; what it used after that reading is lost.
 * Undefined while no backend of it was seen (a remote database).
 */
export function databaseBackendsCpu(database: string): () => Promise<number | undefined> {
  const lastRead = new Map<string, number>();
  return async () => {
    for (const pid of await fs.readdir("/proc")) {
      if (!/^\d+$/.test(pid)) continue;
      const cpu = await processCpu(pid).catch(() => undefined); // gone since the listing
      if (cpu?.name !== "postgres") continue;
      // A backend's title is "postgres: [<cluster_name>: ]<user> <database> <client> <state>" (PostgreSQL's update_process_title).
      const title = await fs.readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
      if (title.split(" ").includes(database)) lastRead.set(pid, cpu.seconds);
    }
    // None seen: the database is on another machine.
    if (lastRead.size === 0) return undefined;
    let total = 0;
    for (const seconds of lastRead.values()) total += seconds;
    return total;
  };
}

function run(command: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd: ROOT, stdio: "inherit" });
    child.once("exit", (code) => (code === 0 ? resolve() : reject(new Error(`${command} ${args.join(" ")} exited with ${code}`))));
  });
}
