import type { Browser, BrowserContext, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bundleAccountPage } from "../../src/web/bundle-account-page.mjs";
import { inviteMember } from "../session-door/support.js";
import { createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { launchChromium, seriousAxeFindings } from "../support/browser.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { meteredCall } from "../support/metering.js";
import { startWebhookReceiver, type WebhookReceiver } from "../support/webhook-receiver.js";

/**
 * Balance alerts in the real browser: a member sets a threshold and an
 * endpoint, the account spends below the threshold, and the page shows the
 * low-balance banner and the signed delivery with its attempt.
 */
const PASSWORD = "correct horse battery staple";
let database: TestDatabase;
let service: TestApp;
let receiver: WebhookReceiver;
let browser: Browser;
let context: BrowserContext;
let page: Page;
let account: { accountId: string; apiKey: string };
const pageErrors: string[] = [];

beforeAll(async () => {
  bundleAccountPage();
  database = await createTestDatabase();
  service = await startTestApp(database, { TYPESAFE_WEBHOOK_ALLOW_LOOPBACK: "on", TYPESAFE_WEBHOOK_POLL_MS: "50" });
  receiver = await startWebhookReceiver();
  browser = await launchChromium();
  context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  context.setDefaultTimeout(10_000);
  page = await context.newPage();
  page.on("console", (message) => {
    if (/Content Security Policy|Refused to/i.test(message.text())) pageErrors.push(message.text());
  });
  page.on("pageerror", (error) => pageErrors.push(`page error: ${error.message}`));
});
afterAll(async () => {
  await context?.close();
  await browser?.close();
  await service?.stop();
  await receiver?.close();
  await database?.close();
});

async function viewReady(view: string): Promise<void> {
  await page.locator(`#view-${view}:not([hidden])`).waitFor();
  await page.waitForFunction((id) => document.getElementById(id)?.getAttribute("aria-busy") !== "true", `view-${view}`);
}

describe("alerts and webhooks in a real browser", () => {
  it("sets a threshold and an endpoint, spends below it, and sees the banner and the delivery", async () => {
    account = await createTestAccount(database.db, { units: 1_000_000, name: "Acme" });
    const { token } = await inviteMember(database.db, account.accountId, "ada.alerts@example.com", new Date(), "owner");
    await page.goto(`${service.url}/account/?invite=${token}`);
    await page.getByLabel("New password", { exact: true }).fill(PASSWORD);
    await page.getByLabel("New password, again").fill(PASSWORD);
    await page.keyboard.press("Enter");
    await viewReady("overview");
    expect(await page.locator("#low-balance").isHidden()).toBe(true);

    await page.getByRole("link", { name: "Alerts and webhooks" }).click();
    await viewReady("alerts");
    await page.getByLabel("Thresholds in credits, separated by commas").fill("0.5");
    await page.getByRole("button", { name: "Save thresholds" }).click();
    await page.locator("#alerts-state", { hasText: "above every threshold" }).waitFor();

    await page.getByLabel("Endpoint URL").fill("http://10.0.0.1/hooks");
    await page.getByRole("button", { name: "Add endpoint" }).click();
    expect(await page.locator("#endpoints-error:not(:empty)").innerText()).toBe("url: must reach a public address (10.0.0.1 is a private address)");

    await page.getByLabel("Endpoint URL").fill(receiver.url);
    await page.getByRole("button", { name: "Add endpoint" }).click();
    const secret = await page.locator("#new-secret-value:not(:empty)").innerText();
    expect(secret).toMatch(/^whsec_/);
    receiver.secrets.push(secret);
    await page.locator(`#endpoints-table tr:has-text("${receiver.url}")`).waitFor();
    await page.getByRole("button", { name: "I have stored it, hide it" }).click();
    expect(await page.locator("#new-secret-value").innerText()).toBe("");
    expect(await seriousAxeFindings(page)).toEqual([]);

    // The account spends below the threshold through the metering every call passes through.
    await service.app.meter.run(meteredCall(account.apiKey, { reserveUnits: 600_000, freeAllowed: false }), async () => ({ value: null, chargeUnits: 600_000 }));

    await page.getByRole("link", { name: "Overview" }).click();
    await viewReady("overview");
    await page.locator("#low-balance:not([hidden])").waitFor();
    expect(await page.locator("#low-balance").innerText()).toMatch(/Your balance is low/);

    await page.getByRole("link", { name: "Alerts and webhooks" }).click();
    await viewReady("alerts");
    expect(await page.locator("#alerts-state").innerText()).toBe("The available balance is below 0.5 credits.");
    // The delivery runs in the service; the page shows it once a refresh finds it delivered.
    await page.waitForFunction(
      () => {
        const delivered = document.querySelector('#deliveries-table tr[data-state="delivered"]');
        if (!delivered) document.getElementById("deliveries-refresh")?.click();
        return delivered !== null;
      },
      undefined,
      { polling: 200 },
    );
    const deliveryRow = page.locator('#deliveries-table tr[data-state="delivered"]');
    expect(await deliveryRow.locator("td").nth(0).innerText()).toBe("balance.low");
    expect(await deliveryRow.locator("td").nth(4).innerText()).toMatch(/^#1: 200 in \d+ ms$/);
    const webhookId = await deliveryRow.locator("code").innerText();
    const got = receiver.received.filter((r) => r.webhookId === webhookId);
    expect(got).toHaveLength(1);
    expect(got[0]!.verifiedWith).toEqual([secret]);
    expect(got[0]!.data).toMatchObject({ account_id: account.accountId, threshold_credits: 0.5, available_credits: 0.4 });
    expect(await seriousAxeFindings(page)).toEqual([]);
    expect(pageErrors).toEqual([]);
  });
});
