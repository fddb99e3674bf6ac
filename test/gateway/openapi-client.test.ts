import fs from "node:fs";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OPENAPI_DOCUMENT_PATH } from "../../src/openapi/served.js";
import { OPENAPI_TYPES_PATH, renderOpenApiTypes } from "../../src/openapi/typescript-types.js";
import { createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { logprobsReply, routeByMarker, startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { startFakeSearch, type FakeSearch } from "../support/fake-search/providers.js";
import { createGatewayClient, decideOnce, refusedSearch, searchQueryOnly } from "../support/openapi-client.js";

/**
 * The OpenAPI document works with the ecosystem's generators: openapi-typescript
 * makes TypeScript types of it (committed as src/gen/openapi-types.ts), and a
 * client written with openapi-fetch against those types alone
 * (test/support/openapi-client.ts) type-checks and talks to a real gateway.
 */

let database: TestDatabase;
let llm: FakeLlm;
let search: FakeSearch;
let service: TestApp;

beforeAll(async () => {
  database = await createTestDatabase();
  llm = await startFakeLlm();
  search = await startFakeSearch();
  service = await startTestApp(database, { TYPESAFE_LLM_BASE_URL: `${llm.url}/v1`, TYPESAFE_LLM_MODEL: "fake-model", TYPESAFE_LLM_MAX_RETRIES: "1", ...search.env });
});
afterAll(async () => {
  await service?.stop();
  await search?.close();
  await llm?.close();
  await database?.close();
});

describe("types generated from the document", () => {
  it("are what openapi-typescript makes of the committed document (npm run generate refreshes them)", async () => {
    const expected = await renderOpenApiTypes(fs.readFileSync(OPENAPI_DOCUMENT_PATH, "utf8"));
    expect(fs.readFileSync(OPENAPI_TYPES_PATH, "utf8") === expected, "src/gen/openapi-types.ts is stale: run npm run generate").toBe(true);
  });

  it("type-check the openapi-fetch client, including the requests they must refuse", () => {
    const file = fileURLToPath(new URL("../support/openapi-client.ts", import.meta.url));
    const config = ts.getParsedCommandLineOfConfigFile(fileURLToPath(new URL("../../tsconfig.json", import.meta.url)), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: () => {} });
    const program = ts.createProgram([file], { ...config!.options, noEmit: true });
    const problems = ts.getPreEmitDiagnostics(program).map((d) => ts.flattenDiagnosticMessageText(d.messageText, "\n"));
    expect(problems).toEqual([]);
    // The client imports the generated types and openapi-fetch, nothing else of this repository.
    const imported = program.getSourceFiles().map((f) => f.fileName).filter((name) => !name.includes("/node_modules/"));
    expect(imported.map((name) => name.slice(name.lastIndexOf("/") + 1)).sort()).toEqual(["openapi-client.ts", "openapi-types.ts"]);
  });
});

describe("an openapi-fetch client with the generated types, against a real gateway", () => {
  it("makes one decision", async () => {
    llm.setHandler(
      routeByMarker({
        "Is it urgent?": () => logprobsReply({ yes: 0.8, no: 0.2 }, { prompt: 1_000, cached: 0 }),
        "Which team?": () => logprobsReply({ A: 0.9, B: 0.1 }, { prompt: 1_000, cached: 0 }),
        "How big": () => logprobsReply({ "0": 0.1, "1": 0.2, "2": 0.7 }, { prompt: 1_000, cached: 0 }),
      }),
    );
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const answer = await decideOnce(createGatewayClient(service.url, apiKey));
    expect(answer.model).toBe("typesafe/service-1.13");
    expect(answer.answers["urgent"]).toMatchObject({ type: "noul", noul: 0.8 });
    expect(answer.answers["team"]).toMatchObject({ type: "choice", choice: "billing" });
    expect(answer.answers["impact"]).toMatchObject({ type: "score", x_label: "high", x_index: 2 });
    expect(answer.billing?.charged_credits).toBeGreaterThan(0);
  });

  it("searches with only q: the default sources and window", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const answer = await searchQueryOnly(createGatewayClient(service.url, apiKey), "rust async");
    expect(answer.sources).toEqual(["brave", "exa", "wikipedia", "hackernews", "gdelt"]);
    expect(answer.window).toBe("any");
    expect(answer.resultCount).toBeGreaterThan(0);
  });

  it("reads a refusal from the error envelope", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const refusal = await refusedSearch(createGatewayClient(service.url, apiKey), "x".repeat(301));
    expect(refusal).toEqual({ status: 400, code: 40001, reason: "INVALID_ARGUMENT", field: "q", rule: "must be at most 300 characters, got 301" });
  });
});
