import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { Webhook } from "standardwebhooks";
import { describe, expect, it } from "vitest";
import { DEFAULT_WEBHOOK_RETRY_DELAYS_MS, loadConfig } from "../../src/config.js";
import { generateSecret, signedHeaders } from "../../src/webhooks/signing.js";

/** docs/webhooks.md stays true: its retry table is the default schedule, and its two verification examples accept what the service signs. */
const page = fs.readFileSync(path.resolve(import.meta.dirname, "../../docs/webhooks.md"), "utf8");
const UNIT_MS: Record<string, number> = { second: 1e3, seconds: 1e3, minutes: 6e4, hour: 36e5, hours: 36e5 };

describe("docs/webhooks.md", () => {
  it("its retry table is the default schedule", () => {
    const rows = [...page.matchAll(/^\| (\d+) \| (\d+) (\w+) \|$/gm)].map((m) => Number(m[2]) * UNIT_MS[m[3]!]!);
    expect(rows).toEqual(DEFAULT_WEBHOOK_RETRY_DELAYS_MS);
    expect(loadConfig({}).webhooks.retryDelaysMs).toEqual(DEFAULT_WEBHOOK_RETRY_DELAYS_MS);
    expect(loadConfig({}).webhooks.timeoutMs).toBe(10_000);
  });

  const secret = generateSecret();
  const body = JSON.stringify({ type: "webhook.test", timestamp: new Date().toISOString(), data: { message: "hi" } });
  const headers = signedHeaders("msg_doc", new Date(), body, [secret, generateSecret()]);

  it("the TypeScript example (standardwebhooks) verifies a delivery, also during a rotation, and refuses a changed body", () => {
    expect(new Webhook(secret).verify(body, headers)).toEqual(JSON.parse(body));
    expect(() => new Webhook(secret).verify(body.replace("hi", "ho"), headers)).toThrow();
  });

  it("the Python example verifies a delivery and refuses a changed body", () => {
    const python = /```python\n([\s\S]*?)```/.exec(page)![1]!;
    const script = `${python}
import json, sys
args = json.loads(sys.argv[1])
print(verify(args["secret"], args["headers"], args["body"].encode()), verify(args["secret"], args["headers"], args["body"].encode() + b" "))`;
    const run = spawnSync("python3", ["-c", script, JSON.stringify({ secret, headers, body })], { encoding: "utf8" });
    expect(run.stderr).toBe("");
    expect(run.stdout.trim()).toBe("True False");
  });
});
