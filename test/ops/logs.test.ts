import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateApiKey, hashApiKey } from "../../src/keys/api-keys.js";
import { listUsage } from "../../src/admin/usage.js";
import { apiError } from "../../src/errors.js";
import { createLogger } from "../../src/logger.js";
import { admit, finish } from "../../src/metering/ledger.js";
import { observeCall } from "../../src/call/observe.js";
import { createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";

let database: TestDatabase;
let service: TestApp;
const lines: string[] = [];
let onLine: (entry: Record<string, unknown>) => void = () => {};

beforeAll(async () => {
  database = await createTestDatabase(4);
  service = await startTestApp(database, { TYPESAFE_LOG_LEVEL: "info" }, {
    onLogLine: (line) => {
      lines.push(line);
      onLine(JSON.parse(line) as Record<string, unknown>);
    },
  });
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

describe("logs say what happened, at the level it deserves", () => {
  it("a caller that disconnects mid-body on the gateway is CANCELLED at info, not a database outage", async () => {
    const logged = new Promise<Record<string, unknown>>((done) => {
      onLine = (entry) => {
        if (entry["msg"] === "call" && entry["procedure"] === "/typesafe.decision.v1.DecisionService/Decide") done(entry);
      };
    });
    const { port } = new URL(service.url);
    const socket = net.connect(Number(port), "127.0.0.1");
    await new Promise((ready) => socket.once("connect", ready));
    socket.write(
      "POST /api/v1/decisions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
        `Authorization: Bearer ${generateApiKey()}\r\nContent-Length: 5000\r\n\r\n{"model":"typesafe/service-1.13",`,
    );
    // The server has the headers and part of the body; the caller goes away.
    setImmediate(() => socket.destroy());
    const entry = await logged;
    expect(entry).toMatchObject({ level: "info", status: "error", reason: "CANCELLED" });
  });

  it("a 5xx other than INTERNAL logs the error without a stack; INTERNAL keeps its stack", async () => {
    const captured: string[] = [];
    const logger = createLogger("info", {}, (line) => captured.push(line));
    const call = { requestId: "r1", procedure: "/p", protocol: "test" };
    await observeCall({ logger }, call, () => Promise.reject(apiError("UPSTREAM_FAILED", "upstream said no"))).catch(() => undefined);
    await observeCall({ logger }, call, () => Promise.reject(new TypeError("a bug"))).catch(() => undefined);
    const [upstream, bug] = captured.map((l) => JSON.parse(l) as { level: string; reason: string; error: { stack?: string } });
    expect(upstream).toMatchObject({ level: "error", reason: "UPSTREAM_FAILED" });
    expect(upstream!.error.stack).toBeUndefined();
    expect(bug).toMatchObject({ level: "error", reason: "INTERNAL" });
    expect(bug!.error.stack).toContain("TypeError: a bug");
  });
});

describe("usage", () => {
  it("lists finished calls newest start first, each with the time it finished", async () => {
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 10 * 32_000 });
    const at = (ms: number) => new Date(Date.UTC(2031, 0, 1, 0, 0, 0, ms) + 0.5);
    const held = async (ms: number) => {
      const admission = await admit(database.db, { keyHash: hashApiKey(apiKey), endpoint: "decide", reserveUnits: 1_000, freeAllowed: false, leaseMs: 60_000, now: at(ms) });
      if (admission.outcome !== "admitted") throw new Error(admission.outcome);
      return admission.requestId;
    };
    const startedFirst = await held(1_137);
    const startedSecond = await held(2_411);
    await finish(database.db, { requestId: startedSecond, success: true, actualUnits: 10, now: at(3_029) });
    await finish(database.db, { requestId: startedFirst, success: true, actualUnits: 20, now: at(4_553) });
    const usage = await listUsage(database.db, accountId, 10);
    expect(usage.map((u) => u.request_id)).toEqual([startedSecond, startedFirst]);
    expect(usage.map((u) => u.at.getTime())).toEqual([at(3_029).getTime(), at(4_553).getTime()]);
  });
});
