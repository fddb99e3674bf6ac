import { spawn } from "node:child_process";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { expect, it } from "vitest";

const root = path.resolve(import.meta.dirname, "../..");

/**
 * `npm start` is the server: it builds, then npm's child is `node … src/start.mjs`,
 * which runs the bundled server in its own process (no shell or loader
 * between), so a SIGTERM sent to the pid a process manager started reaches the
 * server, which drains and exits 0. The bundle serves what dist/ does,
 * including files it reads relative to itself (the OpenAPI document). Its
 * JavaScript heap has the ceiling the start script gives node.
 */
it("SIGTERM to the pid of `npm start` drains the server and stops it", async () => {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-start-"));
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => k !== "DATABASE_URL" && !k.startsWith("TYPESAFE_")));
  const child = spawn("npm", ["start"], { cwd: root, env: { ...env, PORT: "0", TYPESAFE_DATA_DIR: dataDir, TYPESAFE_SEARCH_SOURCES: "none", TYPESAFE_LLM_EMBEDDED: "off" } });
  const lines: string[] = [];
  const exited = new Promise<number | null>((done) => child.on("exit", (code) => done(code)));
  let heapLimitMb = 0;
  const url = await new Promise<string>((resolve, reject) => {
    let buffered = "";
    child.stdout.on("data", (chunk: Buffer) => {
      buffered += chunk.toString();
      const parts = buffered.split("\n");
      buffered = parts.pop()!;
      for (const line of parts) {
        lines.push(line);
        if (line.includes('"msg":"listening"')) {
          heapLimitMb = Number(JSON.parse(line).heap_limit_mb);
          resolve(String(JSON.parse(line).url));
        }
      }
    });
    void exited.then((code) => reject(new Error(`npm start exited with ${code}: ${lines.join("\n")}`)));
  });
  expect((await fetch(`${url}/readyz`)).status).toBe(200);
  // npm start bounds the JavaScript heap (package.json's start script), which keeps its peak RSS under load in bounds;
  // without the option V8 sizes it from the machine's memory (gigabytes here). The limit adds the young generation to the old space's.
  expect(heapLimitMb).toBeGreaterThan(0);
  expect(heapLimitMb).toBeLessThanOrEqual(400);
  const openApi = await fetch(`${url}/api/v1/openapi.json`);
  expect(openApi.status).toBe(200);
  expect(((await openApi.json()) as { paths: Record<string, unknown> }).paths).toHaveProperty("/api/v1/decisions");
  child.kill("SIGTERM");
  expect(await exited).toBe(0);
  const messages = lines.filter((l) => l.startsWith("{")).map((l) => (JSON.parse(l) as { msg: string }).msg);
  expect(messages).toEqual(expect.arrayContaining(["signal received", "shutting down", "stopped"]));
  await expect(fetch(`${url}/readyz`)).rejects.toThrow();
  await fs.rm(dataDir, { recursive: true, force: true });
}, 90_000);
