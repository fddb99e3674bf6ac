import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import path from "node:path";

const root = path.resolve(import.meta.dirname, "../..");
const tsx = path.join(root, "node_modules/.bin/tsx");

/**
 * Runs the operator CLI as `npm run --silent admin -- ...` does (the bundle in
 * dist/, built first when a source changed) and returns its exit code and output.
 */
export function runAdmin(args: string[], env: Record<string, string>): Promise<{ code: number; stdout: string; stderr: string }> {
  buildIfStale();
  return runToExit("dist/bundle/admin.mjs", args, env);
}

/**
 * Runs an entry point of ours to its exit and returns its exit code and
 * output: a built one (dist/, .js or .mjs) with node, a TypeScript one with tsx.
 */
export function runToExit(script: string, args: string[], env: Record<string, string>): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const [command, first] = script.endsWith(".ts") ? [tsx, script] : [process.execPath, script];
    const child = spawn(command, [first, ...args], { cwd: root, env: { ...cleanEnv(), ...env } });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code: code ?? -1, stdout, stderr }));
  });
}

export interface ServiceProcess {
  child: ChildProcess;
  url: string;
  /** Every log line so far. */
  logs: string[];
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

/**
 * Starts the built service (dist/bundle/main.mjs, what `npm start` runs) as its own process and
 * resolves once it logs that it listens. dist/ is rebuilt first when a source is newer (vitest's
 * global setup has done so before any file runs; scripts such as the failover run do it here), so
 * the bundle is the sources' own; it starts without transpiling the sources first.
 */
export function startServiceProcess(env: Record<string, string>): Promise<ServiceProcess> {
  buildIfStale();
  return new Promise((resolve, reject) => {
    // Node itself, not a wrapper command: a SIGKILL sent here must reach the service.
    const child = spawn(process.execPath, ["dist/bundle/main.mjs"], {
      cwd: root,
      // Tests never reach the real providers: a test enables the sources it points at its fakes.
      // No evaluation runner unless a test asks: on the shared embedded store it would run other files' evaluations against this test's upstream.
      env: { ...cleanEnv(), PORT: "0", TYPESAFE_SEARCH_SOURCES: "none", TYPESAFE_LLM_EMBEDDED: "off", TYPESAFE_EVALUATION_EXAMPLES_IN_FLIGHT: "0", ...env },
    });
    const logs: string[] = [];
    let buffered = "";
    const exited = new Promise<number | null>((done) => child.on("exit", (code) => done(code)));
    child.stdout.on("data", (chunk: Buffer) => {
      buffered += chunk.toString();
      const lines = buffered.split("\n");
      buffered = lines.pop()!;
      for (const line of lines) {
        logs.push(line);
        const entry = safeParse(line);
        if (entry?.["msg"] === "listening") {
          resolve({
            child,
            url: String(entry["url"]),
            logs,
            stop: async (signal = "SIGTERM") => {
              child.kill(signal);
              return exited;
            },
          });
        }
      }
    });
    child.stderr.on("data", (chunk: Buffer) => logs.push(chunk.toString()));
    child.on("error", reject);
    void exited.then((code) => reject(new Error(`service exited with ${code}: ${logs.join("\n")}`)));
  });
}

let built = false;
/** `node src/build.mjs --if-stale` once per process: the same check `npm install` and `npm start` make. */
export function buildIfStale(): void {
  if (built) return;
  const run = spawnSync(process.execPath, ["src/build.mjs", "--if-stale"], { cwd: root, stdio: ["ignore", "inherit", "inherit"] });
  if (run.status !== 0) throw new Error("the build failed (its errors are above); service processes and the CLI run dist/");
  built = true;
}

function safeParse(line: string): Record<string, unknown> | undefined {
  try {
    return JSON.parse(line) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

/** The parent's environment without the database and typesafe settings, so tests choose them. */
function cleanEnv(): Record<string, string> {
  return Object.fromEntries(
    Object.entries(process.env).filter(
      (e): e is [string, string] => e[1] !== undefined && e[0] !== "DATABASE_URL" && !e[0].startsWith("TYPESAFE_"),
    ),
  );
}
