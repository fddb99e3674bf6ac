import crypto from "node:crypto";
import fs from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createLogger, type Logger } from "../../src/logger.js";
import { ensureModelFile, ModelFetchError, type ModelSource } from "../../src/upstream/model-fetch.js";

/** 3 MB of fixed bytes, served like a file host: 200 for the whole file, 206 with Content-Range for `Range: bytes=N-` (RFC 9110 §14). */
const FILE = Buffer.from(Array.from({ length: 3_000_000 }, (_, i) => (i * 7 + (i >> 9)) & 0xff));
const SHA = crypto.createHash("sha256").update(FILE).digest("hex");

interface Served {
  url: string;
  ranges: Array<string | undefined>;
  close(): Promise<void>;
}

async function serve(handler: (req: http.IncomingMessage, res: http.ServerResponse, n: number) => void): Promise<Served> {
  const ranges: Array<string | undefined> = [];
  const server = http.createServer((req, res) => {
    ranges.push(req.headers.range);
    handler(req, res, ranges.length);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/model.gguf`,
    ranges,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

function sendFrom(req: http.IncomingMessage, res: http.ServerResponse, body = FILE, cutAfter?: number) {
  const start = Number(/^bytes=(\d+)-$/.exec(req.headers.range ?? "")?.[1] ?? 0);
  const slice = body.subarray(start);
  res.writeHead(start > 0 ? 206 : 200, {
    "content-length": String(slice.length),
    ...(start > 0 ? { "content-range": `bytes ${start}-${body.length - 1}/${body.length}` } : {}),
  });
  if (cutAfter === undefined) return res.end(slice);
  res.write(slice.subarray(0, cutAfter), () => res.destroy());
}

/** A logger that keeps its lines, to check what an operator reads. */
function recordingLogger(): { logger: Logger; lines: Array<{ msg: string; fields: Record<string, unknown> }> } {
  const lines: Array<{ msg: string; fields: Record<string, unknown> }> = [];
  const base = createLogger("silent");
  const logger = new Proxy(base, {
    get(target, key) {
      if (key === "info" || key === "warn" || key === "error") return (msg: string, fields: Record<string, unknown> = {}) => lines.push({ msg, fields });
      return Reflect.get(target, key);
    },
  });
  return { logger, lines };
}

let dir: string;
let server: Served | undefined;
beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-fetch-"));
});
afterEach(async () => {
  await server?.close();
  server = undefined;
  fs.rmSync(dir, { recursive: true, force: true });
});
const source = (url: string, sha256 = SHA): ModelSource => ({ url, bytes: FILE.length, sha256 });

describe("ensureModelFile", () => {
  it("downloads, logs percent, MB/s and time left, and verifies", async () => {
    server = await serve((req, res) => sendFrom(req, res));
    const { logger, lines } = recordingLogger();
    // The data folder's models/ does not exist yet on a first start.
    const file = await ensureModelFile(path.join(dir, "models", "m.gguf"), source(server.url), { logger, signal: new AbortController().signal, progressIntervalMs: 0 });
    expect(fs.readFileSync(file).equals(FILE)).toBe(true);
    const progress = lines.filter((l) => l.msg === "model download progress");
    expect(progress.length).toBeGreaterThan(1);
    expect(progress.at(-1)!.fields).toMatchObject({ percent: 100, seconds_left: 0 });
    expect(progress.every((l) => typeof l.fields.mb_per_s === "number" && typeof l.fields.seconds_left === "number")).toBe(true);
    expect(fs.existsSync(`${file}.part`)).toBe(false);
  });

  it("resumes with a Range request after a cut connection", async () => {
    server = await serve((req, res, n) => sendFrom(req, res, FILE, n === 1 ? 1_000_000 : undefined));
    const { logger, lines } = recordingLogger();
    const file = await ensureModelFile(path.join(dir, "m.gguf"), source(server.url), { logger, signal: new AbortController().signal });
    expect(fs.readFileSync(file).equals(FILE)).toBe(true);
    expect(server.ranges[0]).toBeUndefined();
    expect(server.ranges[1]).toMatch(/^bytes=\d+-$/);
    expect(Number(/\d+/.exec(server.ranges[1]!)![0])).toBeGreaterThan(0);
    expect(lines.some((l) => l.msg === "model download interrupted; resuming")).toBe(true);
  });

  it("resumes a .part left by an earlier process", async () => {
    fs.writeFileSync(path.join(dir, "m.gguf.part"), FILE.subarray(0, 2_000_000));
    server = await serve((req, res) => sendFrom(req, res));
    await ensureModelFile(path.join(dir, "m.gguf"), source(server.url), { logger: createLogger("silent"), signal: new AbortController().signal });
    expect(server.ranges).toEqual(["bytes=2000000-"]);
    expect(fs.readFileSync(path.join(dir, "m.gguf")).equals(FILE)).toBe(true);
  });

  it("refuses a file whose SHA-256 differs: it never takes the model's name", async () => {
    const wrong = Buffer.from(FILE);
    wrong[12345] = wrong[12345]! ^ 1;
    server = await serve((req, res) => sendFrom(req, res, wrong));
    const target = path.join(dir, "m.gguf");
    const failure = ensureModelFile(target, source(server.url), { logger: createLogger("silent"), signal: new AbortController().signal });
    await expect(failure).rejects.toThrow(new ModelFetchError(`model file ${target}.part has SHA-256 ${crypto.createHash("sha256").update(wrong).digest("hex")}, expected ${SHA}`, "mismatch"));
    expect(fs.existsSync(target)).toBe(false);
    expect(fs.existsSync(`${target}.rejected`)).toBe(true);
  });

  it("checks an existing file at every start and uses it without fetching", async () => {
    const target = path.join(dir, "m.gguf");
    fs.writeFileSync(target, FILE);
    await expect(ensureModelFile(target, source("http://127.0.0.1:9/never"), { logger: createLogger("silent"), signal: new AbortController().signal })).resolves.toBe(target);
  });

  it("refuses an existing file that no longer matches, without fetching", async () => {
    const target = path.join(dir, "m.gguf");
    fs.writeFileSync(target, FILE.subarray(0, 10));
    await expect(ensureModelFile(target, source("http://127.0.0.1:9/never"), { logger: createLogger("silent"), signal: new AbortController().signal })).rejects.toMatchObject({
      kind: "mismatch",
      message: `model file ${target} is 10 bytes, expected ${FILE.length}`,
    });
  });

  it("reports a 404 as such, once", async () => {
    server = await serve((_req, res) => res.writeHead(404).end("Entry not found"));
    await expect(ensureModelFile(path.join(dir, "m.gguf"), source(server.url), { logger: createLogger("silent"), signal: new AbortController().signal })).rejects.toMatchObject({
      kind: "http",
      message: `model download from ${server.url} answered HTTP 404`,
    });
    expect(server.ranges).toHaveLength(1);
  });

  it("fails at once without a network: one error, no retries", async () => {
    // A port nobody listens on refuses the connection, as an offline machine's resolver or firewall does.
    const closed = await serve(() => {});
    const url = closed.url;
    await closed.close();
    await expect(ensureModelFile(path.join(dir, "m.gguf"), source(url), { logger: createLogger("silent"), signal: new AbortController().signal })).rejects.toMatchObject({
      kind: "network",
      message: `model download from ${url} failed: ECONNREFUSED`,
    });
  });
});
