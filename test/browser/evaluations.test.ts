import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bundleAccountPage } from "../../src/web/bundle-account-page.mjs";
import { inviteMember } from "../session-door/support.js";
import { createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { launchChromium, seriousAxeFindings } from "../support/browser.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { isProbe, logprobsReply, PROBE_OK, startFakeLlm, userContent, type FakeLlm } from "../support/fake-llm.js";

/**
 * An evaluation in the real browser: an owner uploads a JSON Lines file of
 * labelled states, follows the progress until it finishes, and reads the
 * metrics and the reliability diagram with its table. The fake upstream
 * answers with the documented response shape (fake-llm.ts), overconfident:
 * P(yes) 0.95 for every "refund" state, of which half are labelled false.
 */
const PASSWORD = "correct horse battery staple";
let database: TestDatabase;
let service: TestApp;
let fake: FakeLlm;
let browser: Browser;
let context: BrowserContext;
let page: Page;
let dir: string;
const pageErrors: string[] = [];

beforeAll(async () => {
  bundleAccountPage();
  database = await createTestDatabase(10, { runsEvaluations: true });
  fake = await startFakeLlm((request) => {
    if (isProbe(request.body)) return PROBE_OK;
    const p = userContent(request).includes("refund") ? 0.95 : 0.05;
    return logprobsReply({ yes: p, no: 1 - p }, { prompt: 100 });
  });
  service = await startTestApp(database, { TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_LLM_MODEL: "fake-model", TYPESAFE_EVALUATION_EXAMPLES_IN_FLIGHT: "4", TYPESAFE_EVALUATION_POLL_MS: "50" });
  browser = await launchChromium();
  context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  context.setDefaultTimeout(15_000);
  page = await context.newPage();
  page.on("console", (message) => {
    if (/Content Security Policy|Refused to/i.test(message.text())) pageErrors.push(message.text());
  });
  page.on("pageerror", (error) => pageErrors.push(`page error: ${error.message}`));
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "typesafe-page-evals-"));
});
afterAll(async () => {
  await context?.close();
  await browser?.close();
  await service?.stop();
  await fake?.close();
  await database?.close();
  await fs.rm(dir, { recursive: true, force: true });
});

async function viewReady(view: string): Promise<void> {
  await page.locator(`#view-${view}:not([hidden])`).waitFor();
  await page.waitForFunction((id) => document.getElementById(id)?.getAttribute("aria-busy") !== "true", `view-${view}`);
}

describe("evaluations in a real browser", () => {
  it("uploads labelled examples, follows the progress, and shows the metrics and the reliability diagram", async () => {
    const account = await createTestAccount(database.db, { units: 5_000_000, name: "Acme" });
    const { token } = await inviteMember(database.db, account.accountId, "eve.evals@example.com", new Date(), "owner");
    await page.goto(`${service.url}/account/?invite=${token}`);
    await page.getByLabel("New password", { exact: true }).fill(PASSWORD);
    await page.getByLabel("New password, again").fill(PASSWORD);
    await page.keyboard.press("Enter");
    await viewReady("overview");

    const lines = Array.from({ length: 20 }, (_, i) => JSON.stringify({ state: i < 10 ? `ticket ${i}: I want a refund` : `ticket ${i}: where is my parcel`, labels: { urgent: i < 5 || i >= 18 } }));
    const file = path.join(dir, "tickets.jsonl");
    await fs.writeFile(file, lines.join("\n") + "\n");

    await page.getByRole("link", { name: "Evaluations" }).click();
    await viewReady("evaluations");
    await page.getByLabel("Examples (JSON Lines").setInputFiles(file);
    await page.getByLabel("Credit cap").fill("1");
    await page.getByRole("button", { name: "Start" }).click();
    await page.locator('#evaluations-table tr[data-state="finished"]').waitFor();
    const finished = page.locator('#evaluations-table tr[data-state="finished"]');
    expect(await finished.locator("td").nth(0).innerText()).toBe("tickets.jsonl");
    expect(await finished.locator("td").nth(2).innerText()).toBe("20 / 20");

    await finished.getByRole("button", { name: "Results" }).click();
    await page.locator("#evaluation-results:not([hidden])").waitFor();
    const metrics = page.locator('#evaluation-metrics-table tr[data-question="urgent"] td');
    // 10 "refund" states answered 0.95 (5 labelled true), 10 others answered 0.05 (2 labelled true): 13 of 20 right.
    expect(await metrics.nth(2).innerText()).toBe("20 / 20");
    expect(await metrics.nth(3).innerText()).toBe("0.650");
    // ECE: (10 × |0.95 − 0.5| + 10 × |0.05 − 0.2|) / 20 = 0.300.
    expect(await metrics.nth(6).innerText()).toBe("0.300");
    const bins = page.locator("#reliability-table tbody tr");
    expect(await bins.count()).toBe(10);
    expect(await bins.nth(0).locator("td").nth(1).innerText()).toBe("10");
    expect(await bins.nth(9).locator("td").nth(3).innerText()).toBe("0.500");
    expect(await page.locator("#reliability-chart").boundingBox()).not.toBeNull();
    expect(await seriousAxeFindings(page)).toEqual([]);
    expect(pageErrors).toEqual([]);
  });
});
