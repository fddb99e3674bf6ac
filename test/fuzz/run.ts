/**
 * npm run fuzz [-- --seconds 600 --seed 7]
 *
 * The fuzz cases of `npm test` (JSON, binary, and compressed bodies on gRPC,
 * gRPC-Web and Connect; every AccountService method and the usage CSV
 * with an owner's session) for as long as asked, against the real service
 * (in this process, on a scratch database: DATABASE_URL's server, or an
 * embedded store in a temp folder). Prints counts by class, surface and
 * reason, and every broken rule; exits 1 when any rule broke. Loopback only.
 */
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import fc from "fast-check";
import { startApp } from "../../src/app.js";
import { loadConfig } from "../../src/config.js";
import { createLogger } from "../../src/logger.js";
import { createTestAccount } from "../support/app.js";
import { accountCase, csvCase, sendAccount, sendCsv, sendUpload, signedInOwner, uploadCase } from "./account-cases.js";
import { binaryCase, comparableVerdicts, compressedCase, jsonCase, sendBinary, sendCompressed, sendJson, type Verdict } from "./cases.js";

const { values } = parseArgs({ options: { seconds: { type: "string", default: "60" }, seed: { type: "string", default: "1" } } });
const seconds = Math.max(1, Number(values.seconds));

async function main(): Promise<void> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-fuzz-"));
  const config = loadConfig({ PORT: "0", TYPESAFE_LOG_LEVEL: "silent", TYPESAFE_SEARCH_SOURCES: "none", TYPESAFE_LLM_EMBEDDED: "off", TYPESAFE_DATA_DIR: dataDir, ...(process.env.DATABASE_URL ? { DATABASE_URL: process.env.DATABASE_URL } : {}) });
  const app = await startApp(config, createLogger("silent"));
  const { apiKey } = await createTestAccount(app.database.db, { units: 1_000_000 });
  const { cookie } = await signedInOwner(app.server.url, app.database.db);
  const counts = new Map<string, number>();
  const problems: string[] = [];
  let broken = 0;
  let disagreements = 0;
  const record = (kind: string, verdicts: Verdict[], input: unknown, comparable = verdicts.map((v) => `${v.reason}|${v.field}`)) => {
    for (const v of verdicts) {
      const key = `${kind.padEnd(6)} ${v.surface.padEnd(13)} ${String(v.status).padEnd(4)} ${v.reason ?? "OK"}`;
      counts.set(key, (counts.get(key) ?? 0) + 1);
      if (v.problem) broken++;
      if (v.problem && problems.length < 50) problems.push(`${v.surface}: ${v.problem} ← ${JSON.stringify(input).slice(0, 200)}`);
    }
    if (new Set(comparable).size > 1) {
      disagreements++;
      if (problems.length < 50) problems.push(`surfaces disagree: ${JSON.stringify(verdicts)} ← ${JSON.stringify(input).slice(0, 200)}`);
    }
  };
  // The service runs in this process: its resident memory is this process's, sampled between calls.
  const startRssBytes = process.memoryUsage().rss;
  let peakRssBytes = startRssBytes;
  const rssSampler = setInterval(() => (peakRssBytes = Math.max(peakRssBytes, process.memoryUsage().rss)), 250);
  const deadline = Date.now() + seconds * 1000;
  let calls = 0;
  for (let batch = 0; Date.now() < deadline; batch++) {
    const seed = Number(values.seed) * 1_000_003 + batch;
    const jsons = fc.sample(jsonCase, { seed, numRuns: 20 });
    const binaries = fc.sample(binaryCase, { seed, numRuns: 20 });
    const compressed = fc.sample(compressedCase, { seed, numRuns: 20 });
    const accounts = fc.sample(accountCase, { seed, numRuns: 20 });
    const csvs = fc.sample(csvCase, { seed, numRuns: 20 });
    const uploads = fc.sample(uploadCase, { seed, numRuns: 20 });
    for (let i = 0; i < 20 && Date.now() < deadline; i++) {
      const json = jsons[i]!;
      record("json", await sendJson(app.server.url, apiKey, json.rpc, json.body), json);
      const binary = binaries[i]!;
      record("binary", await sendBinary(app.server.url, apiKey, binary.rpc, binary.bytes), { rpc: binary.rpc, bytes: Buffer.from(binary.bytes).toString("hex") });
      const c = compressed[i]!;
      const input = { rpc: c.rpc, encoding: c.encoding, flag: c.flag, body: Buffer.from(c.body.subarray(0, 64)).toString("hex") };
      const verdicts = await sendCompressed(app.server.url, apiKey, c);
      record("zipped", verdicts, input, comparableVerdicts(c, verdicts));
      const account = accounts[i]!;
      const accountVerdicts = await sendAccount(app.server.url, cookie, account);
      // Account calls change state (a key made, an invite sent), so the surfaces need not agree; none may break a rule.
      record("acct", accountVerdicts, { method: account.method.name, body: account.body }, ["-"]);
      record("csv", [await sendCsv(app.server.url, cookie, csvs[i]!)], { query: csvs[i] });
      record("upload", [await sendUpload(app.server.url, cookie, uploads[i]!)], uploads[i]!);
      calls += 9 + accountVerdicts.length;
    }
  }
  clearInterval(rssSampler);
  const { rss: endRssBytes, heapUsed: endHeapBytes, external: endExternalBytes } = process.memoryUsage();
  await app.stop();
  await fs.rm(dataDir, { recursive: true, force: true });
  for (const [key, count] of [...counts].sort()) process.stdout.write(`${key.padEnd(60)} ${count}\n`);
  for (const problem of problems) process.stdout.write(`problem: ${problem}\n`);
  const mb = (bytes: number) => (bytes / 1024 / 1024).toFixed(0);
  process.stdout.write(`rss: ${mb(startRssBytes)} MB at start, ${mb(peakRssBytes)} MB peak, ${mb(endRssBytes)} MB at the end (heap ${mb(endHeapBytes)} MB, external ${mb(endExternalBytes)} MB)\n`);
  process.stdout.write(`fuzz: ${calls} requests in ${seconds} s · ${broken} broken rules · ${disagreements} disagreements\n`);
  process.exit(broken > 0 || disagreements > 0 ? 1 : 0);
}

main().catch((err: unknown) => {
  process.stderr.write(`fuzz failed: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(2);
});
