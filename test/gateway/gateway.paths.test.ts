import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";

let database: TestDatabase;
let service: TestApp;
let url: string;
const logLines: Record<string, unknown>[] = [];

/** The real service on port 0, logging into logLines, to check the one log line per refused call. */
beforeAll(async () => {
  database = await createTestDatabase();
  service = await startTestApp(database, { TYPESAFE_LOG_LEVEL: "info" }, { onLogLine: (line) => logLines.push(JSON.parse(line)) });
  url = service.url;
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

describe("404 and 405 carry a request id and are logged like other calls", () => {
  it.each([
    ["an unknown path", "POST", "/api/v2/decisions", 404, 40401, "NOT_FOUND", null],
    ["an unknown GET path", "GET", "/nope", 404, 40401, "NOT_FOUND", null],
    ["GET on a POST path", "GET", "/api/v1/decisions", 405, 40501, "METHOD_NOT_ALLOWED", "POST"],
    ["POST on a GET path", "POST", "/api/v1/sources", 405, 40501, "METHOD_NOT_ALLOWED", "GET"],
    ["POST /healthz", "POST", "/healthz", 405, 40501, "METHOD_NOT_ALLOWED", "GET"],
    ["POST /readyz", "POST", "/readyz", 405, 40501, "METHOD_NOT_ALLOWED", "GET"],
    ["DELETE /healthz", "DELETE", "/healthz", 405, 40501, "METHOD_NOT_ALLOWED", "GET"],
  ])("%s → refused with an id and one log line", async (_name, method, path, status, code, reason, allow) => {
    const response = await fetch(`${url}${path}`, { method, body: method === "POST" ? "{}" : undefined });
    const body = (await response.json()) as { code: number; data: Record<string, unknown> };
    const requestId = response.headers.get("x-request-id");
    expect(response.status).toBe(status);
    expect(response.headers.get("allow")).toBe(allow);
    expect(requestId).toMatch(UUID);
    expect(body).toMatchObject({ code, data: { reason, request_id: requestId } });
    const logged = logLines.filter((line) => line["request_id"] === requestId);
    expect(logged).toEqual([
      expect.objectContaining({ msg: "call", procedure: path, protocol: "gateway", status: "error", reason, level: "info" }),
    ]);
  });

  it("every gateway answer has its own request id", async () => {
    const ids = await Promise.all(
      Array.from({ length: 5 }, async () => (await fetch(`${url}/nope`)).headers.get("x-request-id")),
    );
    expect(new Set(ids).size).toBe(5);
  });

  it("a very long unknown path is logged shortened", async () => {
    const path = `/x${"a".repeat(1000)}`;
    const response = await fetch(`${url}${path}`);
    const requestId = response.headers.get("x-request-id");
    const [line] = logLines.filter((l) => l["request_id"] === requestId);
    expect(String(line?.["procedure"]).length).toBeLessThanOrEqual(201);
  });
});

describe("health probes", () => {
  it.each([
    ["/healthz", { status: "up", decisions: { engine: "off" } }],
    ["/readyz", { status: "ready", decisions: { engine: "off" } }],
  ])("GET %s → 200 in the envelope", async (path, data) => {
    const response = await fetch(`${url}${path}`);
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({ code: 0, message: "ok", data });
  });
});
