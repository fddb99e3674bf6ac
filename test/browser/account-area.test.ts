import fs from "node:fs";
import path from "node:path";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AccountService } from "../../src/gen/typesafe/account/v1/account_service_pb.js";
import { bundleAccountPage } from "../../src/web/bundle-account-page.mjs";
import { postJson, startTestApp, type TestApp } from "../support/app.js";
import { launchChromium, seriousAxeFindings } from "../support/browser.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { runAdmin } from "../support/process.js";

/** Screenshots of every view, for people to look at; one of them is committed as docs/account-area.png. */
const SCREENSHOTS = path.resolve(import.meta.dirname, "../../reports/browser");
const EMAIL = "ada@example.com";
const PASSWORD = "correct horse battery staple";
const decision = {
  model: "typesafe/service-1.13",
  state: "the checkout page returns 500",
  questions: { urgent: { type: "noul", instructions: "Is this urgent?" } },
};

let database: TestDatabase;
let fakeLlm: FakeLlm;
let service: TestApp;
let browser: Browser;
let context: BrowserContext;
let page: Page;
let accountId: string;
let inviteUrl: string;
/** Browser console lines that report a refused script, style or connection: the page must work under its own policy. */
const policyViolations: string[] = [];

beforeAll(async () => {
  bundleAccountPage();
  fs.mkdirSync(SCREENSHOTS, { recursive: true });
  database = await createTestDatabase();
  fakeLlm = await startFakeLlm();
  service = await startTestApp(database, { TYPESAFE_LLM_BASE_URL: `${fakeLlm.url}/v1` });
  browser = await launchChromium();
});
afterAll(async () => {
  await browser?.close();
  await service?.stop();
  await fakeLlm?.close();
  await database?.close();
});

/** A fresh browser profile (no cookies), watching the console for policy violations. */
async function openBrowser(): Promise<void> {
  await context?.close();
  context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: service.url });
  // A step that waits longer than this has failed; the later steps then fail fast too.
  context.setDefaultTimeout(10_000);
  page = await context.newPage();
  page.on("console", (message) => {
    if (/Content Security Policy|Refused to/i.test(message.text())) policyViolations.push(message.text());
  });
  page.on("pageerror", (error) => policyViolations.push(`page error: ${error.message}`));
}

/** Waits until the view is shown and done loading (its section drops aria-busy). */
async function viewReady(view: string): Promise<void> {
  await page.locator(`#view-${view}:not([hidden])`).waitFor();
  await page.waitForFunction((id) => document.getElementById(id)?.getAttribute("aria-busy") !== "true", `view-${view}`);
}

async function expectAccessible(what: string): Promise<void> {
  await page.screenshot({ path: path.join(SCREENSHOTS, `${what}.png`), fullPage: true });
  expect(await seriousAxeFindings(page), `serious or critical axe findings on ${what}`).toEqual([]);
}

function text(selector: string): Promise<string> {
  return page.locator(selector).innerText();
}

/** GetAccount from Node with the given Cookie header, as a browser holding that cookie would call it. */
function getAccountWithCookie(cookie: string) {
  const client = createClient(AccountService, createConnectTransport({ baseUrl: service.url, httpVersion: "1.1" }));
  return client.getAccount({}, { headers: { cookie } });
}

describe("the account area in a real browser", () => {
  let secret = "";
  let keyRequestId = "";
  let sessionCookie = "";

  it("starts from the operator's CLI: an account with credits, a grant, and an invited member", async () => {
    const env = { DATABASE_URL: database.url };
    const created = await runAdmin(["accounts", "create", "--name", "Acme Research", "--credits", "2.5", "--free-requests", "0"], env);
    expect(created.code, created.stderr).toBe(0);
    accountId = JSON.parse(created.stdout).account_id;
    const granted = await runAdmin(["credits", "grant", "--account", accountId, "--credits", "0.75"], env);
    expect(granted.code, granted.stderr).toBe(0);
    const invited = await runAdmin(["members", "invite", "--account", accountId, "--email", EMAIL], env);
    expect(invited.code, invited.stderr).toBe(0);
    const invite = JSON.parse(invited.stdout) as { invite_url: string; invite_token: string; expires_at: string };
    const printed = new URL(invite.invite_url);
    expect(printed.pathname).toBe("/account/");
    expect(printed.searchParams.get("invite")).toBe(invite.invite_token);
    expect(Date.parse(invite.expires_at)).toBeGreaterThan(Date.now());
    // The CLI prints the public URL; the test's service listens on a port of its own.
    inviteUrl = `${service.url}${printed.pathname}${printed.search}`;
  });

  it("accepts the invite: two matching passwords of 12 or more characters, then the overview", async () => {
    await openBrowser();
    await page.goto(inviteUrl);
    await page.locator("#view-invite:not([hidden])").waitFor();
    await expectAccessible("invite");

    await page.getByLabel("New password", { exact: true }).fill("too short");
    await page.getByLabel("New password, again").fill("too short");
    await page.keyboard.press("Enter");
    expect(await text("#invite-error")).toMatch(/at least 12 characters/);

    await page.getByLabel("New password", { exact: true }).fill(PASSWORD);
    await page.getByLabel("New password, again").fill(`${PASSWORD}!`);
    await page.keyboard.press("Enter");
    expect(await text("#invite-error")).toMatch(/differ/);

    await page.getByLabel("New password, again").fill(PASSWORD);
    await page.keyboard.press("Enter");
    await viewReady("overview");
    // The spent token leaves the address bar.
    expect(new URL(page.url()).search).toBe("");
    expect(await text("#who-email")).toBe(EMAIL);
  });

  it("signs in with email and password in a fresh browser, by keyboard", async () => {
    await openBrowser();
    await page.goto(`${service.url}/account/`);
    await page.locator("#view-sign-in:not([hidden])").waitFor();
    await expectAccessible("sign-in");

    await page.getByLabel("Email", { exact: true }).fill(EMAIL);
    await page.getByLabel("Password", { exact: true }).fill("not the password at all");
    await page.keyboard.press("Enter");
    await page.locator("#sign-in-error:not(:empty)").waitFor();
    await expect(page.locator("#view-sign-in").isVisible()).resolves.toBe(true);

    // After a refusal the page empties the password and puts the focus there.
    expect(await page.evaluate(() => document.activeElement?.id)).toBe("sign-in-password");
    await page.keyboard.type(PASSWORD);
    await page.keyboard.press("Enter");
    await viewReady("overview");
    // The session cookie is HttpOnly: the page's script cannot read it.
    expect(await page.evaluate(() => document.cookie)).toBe("");
    const cookies = await context.cookies(service.url);
    expect(cookies.length).toBeGreaterThan(0);
    expect(cookies.every((c) => c.httpOnly && c.sameSite === "Strict")).toBe(true);
    sessionCookie = cookies.map((c) => `${c.name}=${c.value}`).join("; ");
  });

  it("shows the balance the CLI granted, the free requests and the limits", async () => {
    expect(await text("#balance")).toBe("3.25");
    expect(await text("#held")).toBe("0");
    expect(await text("#available")).toBe("3.25");
    expect(await text("#free-requests")).toBe("0");
    expect(await text("#in-flight")).toBe("0");
    expect(await text("#limits")).toBe("5 in flight, 60 a minute");
    expect(await text("#account-name")).toBe("Acme Research");
    await expectAccessible("overview-empty");
  });

  it("creates a key, shows its secret once with a copy button, stores it nowhere, and forgets it when dismissed", async () => {
    // By keyboard: the nav link, then focus on the view's heading, then Tab to the name field.
    await page.getByRole("link", { name: "API keys" }).focus();
    await page.keyboard.press("Enter");
    await viewReady("keys");
    expect(await page.evaluate(() => document.activeElement?.id)).toBe("keys-title");
    await page.keyboard.press("Tab");
    expect(await page.evaluate(() => document.activeElement?.id)).toBe("key-name");
    await page.keyboard.type("ci");
    await page.keyboard.press("Enter");
    await page.locator("#new-key:not([hidden])").waitFor();
    // The new key's panel takes the focus, so a screen reader reads the warning first.
    expect(await page.evaluate(() => document.activeElement?.id)).toBe("new-key");
    secret = await text("#new-key-secret");
    expect(secret).toMatch(/^ts_live_[0-9A-Za-z]{49}$/);
    expect(await text("#new-key")).toMatch(/only time the secret is shown/);
    await expectAccessible("keys-new-secret");

    await page.getByRole("button", { name: "Copy key" }).click();
    await page.locator("#copy-status:not(:empty)").waitFor();
    expect(await page.evaluate(() => navigator.clipboard.readText())).toBe(secret);

    const stored = await page.evaluate(() => ({ local: JSON.stringify(localStorage), session: JSON.stringify(sessionStorage), cookie: document.cookie }));
    expect(stored).toEqual({ local: "{}", session: "{}", cookie: "" });
    expect(JSON.stringify(await context.cookies())).not.toContain(secret.slice(8));

    const row = page.locator("#keys-table tbody tr", { hasText: "ci" });
    expect(await row.innerText()).toContain(`…${secret.slice(-4)}`);
    expect(await row.innerText()).not.toContain(secret.slice(8, 20));

    await page.getByRole("button", { name: "I have stored it, hide it" }).click();
    expect(await page.locator("#new-key").isHidden()).toBe(true);
    expect(await page.content()).not.toContain(secret.slice(8));
    await page.reload();
    await viewReady("keys");
    expect(await page.content()).not.toContain(secret.slice(8));
  });

  it("the new key makes a real decision from Node (200)", async () => {
    const answer = await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey: secret });
    expect(answer.status).toBe(200);
    keyRequestId = answer.headers.get("x-request-id") ?? "";
    expect(keyRequestId).not.toBe("");
  });

  it("sets the key's limits from the page (decisions only, a daily budget): the row shows them with the budget spent, and the API holds the key to them", async () => {
    const row = page.locator("#keys-table tbody tr", { hasText: "ci" });
    await row.getByRole("button", { name: /^Limits/ }).click();
    await page.locator("#limits-dialog[open]").waitFor();
    await page.locator("#limits-dialog").getByLabel("Search", { exact: true }).uncheck();
    await page.locator("#edit-budget").fill("0.032");
    await page.locator("#edit-period").selectOption("day");
    await expectAccessible("keys-limits-dialog");
    await page.getByRole("button", { name: "Save limits" }).click();
    await row.getByText("decisions only · 0.032 credits a day").waitFor();
    // The call made before the budget was set counts: the budget is of the whole UTC day.
    expect(await row.innerText()).toMatch(/0\.000\d+ spent, 0\.031\d+ left/);
    const refused = await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey: secret });
    expect([refused.status, (refused.body.data as { reason: string }).reason]).toEqual([402, "KEY_BUDGET_EXCEEDED"]);
    await expectAccessible("keys-with-limits");
  });

  it("shows that call in the usage table, with the key's name, and offers the same rows as CSV", async () => {
    await page.getByRole("link", { name: "Usage" }).click();
    await viewReady("usage");
    const row = page.locator(`#usage-table tbody tr[data-request-id="${keyRequestId}"]`);
    await row.waitFor();
    const cells = await row.locator("td").allInnerTexts();
    expect(cells[1]).toBe("decide");
    expect(cells[2]).toBe(`ci (ts_live_…${secret.slice(-4)})`);
    expect(cells[3]).toBe("paid");
    expect(Number(cells[5])).toBeGreaterThan(0);
    expect(cells[6]).toBe("settled");
    await expectAccessible("usage");

    const href = await page.getByRole("link", { name: "Download CSV" }).getAttribute("href");
    expect(href).toMatch(/^\/account\/v1\/usage\.csv\?since=/);
    const csv = await page.evaluate(async (url) => (await fetch(url)).text(), href!);
    expect(csv.split("\r\n")[0]).toMatch(/^request_id,endpoint,/);
    expect(csv).toContain(keyRequestId);
  });

  it("counts that call in the chart's data for today", async () => {
    await page.getByRole("link", { name: "Overview" }).click();
    await viewReady("overview");
    const today = new Date().toISOString().slice(0, 10);
    // The table sits in a closed <details>: read its text, not its rendering.
    const headers = await page.locator("#chart-table thead th").allTextContents();
    const cells = await page.locator(`#chart-table tbody tr[data-day="${today}"] td`).allTextContents();
    const column = (label: string) => cells[headers.indexOf(label) - 1];
    expect(column("Decisions: calls")).toBe("1");
    expect(column("Search: calls")).toBe("0");
    expect(Number(column("Decisions: credits"))).toBeGreaterThan(0);
    expect(await text("#chart-summary")).toMatch(/^1 call and /);
    expect(Number(await text("#balance"))).toBeLessThan(3.25);
    await page.locator("#view-overview").screenshot({ path: path.join(SCREENSHOTS, "overview-chart.png") });
    await expectAccessible("overview");
  });

  it("lists the activity: the invite accepted, the sign-in, the key made, the credits granted", async () => {
    await page.getByRole("link", { name: "Activity" }).click();
    await viewReady("activity");
    const kinds = await page.locator("#activity-table tbody tr").evaluateAll((rows) => rows.map((r) => (r as HTMLElement).dataset["kind"]));
    expect(kinds).toEqual(expect.arrayContaining(["invite_accepted", "signed_in", "key_created", "credits_granted", "member_invited"]));
    await expectAccessible("activity");
  });

  it("revokes the key after a confirmation, and the next API call with it gets 401", async () => {
    await page.getByRole("link", { name: "API keys" }).click();
    await viewReady("keys");
    const row = page.locator("#keys-table tbody tr", { hasText: "ci" });
    await row.getByRole("button", { name: /Revoke/ }).click();
    await page.locator("#revoke-dialog[open]").waitFor();
    await expectAccessible("keys-revoke-dialog");

    // "Keep it" is the default: Escape or the first button leave the key alone.
    await page.keyboard.press("Escape");
    expect(await row.innerText()).toContain("active");

    await row.getByRole("button", { name: /Revoke/ }).click();
    await page.getByRole("button", { name: "Revoke key" }).click();
    await page.locator("#keys-table tbody tr.revoked", { hasText: "ci" }).waitFor();
    const refused = await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey: secret });
    expect(refused.status).toBe(401);
  });

  it("signs out: the page shows sign-in, and the old session cookie is refused", async () => {
    expect((await getAccountWithCookie(sessionCookie)).member?.email).toBe(EMAIL);
    await page.getByRole("button", { name: "Sign out" }).click();
    await page.locator("#view-sign-in:not([hidden])").waitFor();
    expect(await page.locator("#nav").isHidden()).toBe(true);

    const refused = await getAccountWithCookie(sessionCookie).then(
      () => undefined,
      (err: unknown) => ConnectError.from(err),
    );
    expect(refused?.code).toBe(Code.Unauthenticated);
    await page.goto(`${service.url}/account/#keys`);
    await page.locator("#view-sign-in:not([hidden])").waitFor();
    expect(await page.locator("#view-keys").isHidden()).toBe(true);
  });

  it("tells a reader whose sign-ins are throttled when to try again", async () => {
    const email = page.getByLabel("Email", { exact: true });
    const password = page.getByLabel("Password", { exact: true });
    const error = page.locator("#sign-in-error");
    let message = "";
    // Five failures for one email are answered as wrong; the next is throttled with Retry-After.
    for (let attempt = 1; attempt <= 6; attempt++) {
      await email.fill("nobody@example.com");
      await password.fill(`wrong password ${attempt}`);
      await password.press("Enter");
      await page.locator("#sign-in-error:not(:empty)").waitFor();
      message = await error.innerText();
      if (attempt < 6) expect(message).not.toMatch(/Try again in/);
      // Emptied here, so the next non-empty message is the next answer.
      await page.evaluate(() => (document.getElementById("sign-in-error")!.textContent = ""));
    }
    expect(message).toMatch(/Try again in \d+ seconds\.$/);
  });

  it("ran every view under the page's own Content-Security-Policy without a refusal", () => {
    expect(policyViolations).toEqual([]);
  });
});
