import { generate } from "otplib";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bundleAccountPage } from "../../src/web/bundle-account-page.mjs";
import { postJson, startTestApp, type TestApp } from "../support/app.js";
import { launchChromium, seriousAxeFindings } from "../support/browser.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { startFakeSearch, type FakeSearch } from "../support/fake-search/providers.js";
import { runAdmin } from "../support/process.js";

/**
 * An owner runs their team from the page, in Debian's chromium: invites a
 * member (the link shown once), the member accepts, sets up two-factor
 * sign-in (the test computes the codes from the key the page shows, as an
 * authenticator app would), signs in with a code, and makes a key with a
 * budget and the decisions scope only, which the API holds to both; the owner
 * removes them, and the key stops with them.
 */
const OWNER = "grace@example.com";
const MEMBER = "alan@example.com";
const PASSWORD = "correct horse battery staple";

let database: TestDatabase;
let service: TestApp;
let fakeLlm: FakeLlm;
let fakeSearch: FakeSearch;
let browser: Browser;
const contexts: BrowserContext[] = [];
const policyViolations: string[] = [];

beforeAll(async () => {
  bundleAccountPage();
  database = await createTestDatabase();
  fakeLlm = await startFakeLlm();
  fakeSearch = await startFakeSearch({ ids: ["hackernews"] });
  service = await startTestApp(database, { ...fakeSearch.env, TYPESAFE_LLM_BASE_URL: `${fakeLlm.url}/v1` });
  browser = await launchChromium();
});
afterAll(async () => {
  for (const context of contexts) await context.close();
  await browser?.close();
  await service?.stop();
  await fakeLlm?.close();
  await fakeSearch?.close();
  await database?.close();
});

/** A fresh browser profile (no cookies), its console watched for policy refusals. */
async function openBrowser(): Promise<Page> {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  context.setDefaultTimeout(10_000);
  contexts.push(context);
  const page = await context.newPage();
  page.on("console", (message) => {
    if (/Content Security Policy|Refused to/i.test(message.text())) policyViolations.push(message.text());
  });
  page.on("pageerror", (error) => policyViolations.push(`page error: ${error.message}`));
  return page;
}

async function viewReady(page: Page, view: string): Promise<void> {
  await page.locator(`#view-${view}:not([hidden])`).waitFor();
  await page.waitForFunction((id) => document.getElementById(id)?.getAttribute("aria-busy") !== "true", `view-${view}`);
}

/** The link as the test's browser reaches it: the printed public URL names the configured port (0); the service listens on its own. */
function reachable(link: string): string {
  const printed = new URL(link);
  return `${service.url}${printed.pathname}${printed.search}`;
}

async function acceptInvite(page: Page, link: string): Promise<void> {
  await page.goto(reachable(link));
  await page.locator("#view-invite:not([hidden])").waitFor();
  await page.getByLabel("New password", { exact: true }).fill(PASSWORD);
  await page.getByLabel("New password, again").fill(PASSWORD);
  await page.keyboard.press("Enter");
  await viewReady(page, "overview");
}

/** The code an authenticator app holding this key shows now, or `stepsAhead` 30-second steps later. */
function totp(secret: string, stepsAhead = 0): Promise<string> {
  return generate({ secret, epoch: Math.floor(Date.now() / 1000) + 30 * stepsAhead });
}

const decision = { model: "typesafe/service-1.13", state: "a ticket", questions: { urgent: { type: "noul", instructions: "Is it urgent?" } } };
const refusal = (answer: { status: number; body: { data: Record<string, unknown> } }) => [answer.status, answer.body.data["reason"]];

describe("an owner runs their team from the page", () => {
  let owner: Page;
  let member: Page;
  let inviteLink = "";
  let secret = "";
  let apiKey = "";

  it("the operator's CLI makes the account and invites its first member, who becomes its owner", async () => {
    const env = { DATABASE_URL: database.url };
    const created = await runAdmin(["accounts", "create", "--name", "Team Co", "--credits", "1"], env);
    expect(created.code, created.stderr).toBe(0);
    const invited = await runAdmin(["members", "invite", "--account", JSON.parse(created.stdout).account_id, "--email", OWNER], env);
    expect(invited.code, invited.stderr).toBe(0);
    expect(JSON.parse(invited.stdout).role).toBe("owner");
    owner = await openBrowser();
    await acceptInvite(owner, JSON.parse(invited.stdout).invite_url);
    expect(await owner.locator("#who-role").innerText()).toBe("owner");
  });

  it("the owner invites a member from the team view: the link is shown once", async () => {
    await owner.getByRole("link", { name: "Team" }).click();
    await viewReady(owner, "team");
    await owner.getByLabel("Email to invite").fill(MEMBER);
    await owner.getByLabel("Role to give").selectOption("member");
    await owner.getByRole("button", { name: "Invite" }).click();
    await owner.locator("#new-invite:not([hidden])").waitFor();
    inviteLink = await owner.locator("#new-invite-url").innerText();
    expect(new URL(inviteLink).searchParams.get("invite")).toMatch(/^[A-Za-z0-9_-]{43}$/);
    await owner.locator("#members-table tbody tr", { hasText: `${MEMBER} (invited)` }).waitFor();
    expect(await seriousAxeFindings(owner)).toEqual([]);
    await owner.getByRole("button", { name: "Done, hide it" }).click();
    expect(await owner.content()).not.toContain(new URL(inviteLink).searchParams.get("invite")!);
  });

  it("the member accepts, sees the member role, and may not invite anyone", async () => {
    member = await openBrowser();
    await acceptInvite(member, inviteLink);
    expect(await member.locator("#who-role").innerText()).toBe("member");
    await member.getByRole("link", { name: "Team" }).click();
    await viewReady(member, "team");
    expect(await member.locator("#invite-member-form").isHidden()).toBe(true);
    expect(await member.locator("#members-table tbody tr").count()).toBe(2);
  });

  it("the member sets up two-factor sign-in with a QR code or the key, confirms with a code, and gets recovery codes once", async () => {
    await member.getByRole("link", { name: "Security" }).click();
    await viewReady(member, "security");
    await member.getByRole("button", { name: "Set up two-factor sign-in" }).click();
    await member.locator("#enroll:not([hidden])").waitFor();
    expect(await member.locator("#enroll-qr svg path").count()).toBe(1);
    secret = await member.locator("#enroll-secret").innerText();
    expect(secret).toMatch(/^[A-Z2-7]{32}$/);
    expect(await member.locator("#enroll-uri").innerText()).toContain(`secret=${secret}`);
    expect(await seriousAxeFindings(member)).toEqual([]);
    await member.getByLabel("Code from the app").first().fill(await totp(secret));
    await member.getByRole("button", { name: "Turn on" }).click();
    await member.locator("#recovery:not([hidden])").waitFor();
    expect(await member.locator("#recovery-codes li").count()).toBe(10);
    await member.getByRole("button", { name: "I have stored them, hide them" }).click();
    await member.locator("#two-factor-state", { hasText: "is on" }).waitFor();
    expect(await member.locator("#recovery-codes li").count()).toBe(0);
  });

  it("signs in again: the password, then a code of the app", async () => {
    await member.getByRole("button", { name: "Sign out" }).click();
    await member.locator("#view-sign-in:not([hidden])").waitFor();
    await member.getByLabel("Email", { exact: true }).fill(MEMBER);
    await member.getByLabel("Password", { exact: true }).fill(PASSWORD);
    await member.keyboard.press("Enter");
    await member.locator("#view-second-step:not([hidden])").waitFor();
    expect(await member.evaluate(() => document.activeElement?.id)).toBe("second-step-code");
    expect(await seriousAxeFindings(member)).toEqual([]);

    // The code that turned it on is spent: a wrong one is refused, then the next step's code passes.
    await member.getByLabel("Authentication code").fill("000000");
    await member.keyboard.press("Enter");
    await member.locator("#second-step-error:not(:empty)").waitFor();
    await member.getByLabel("Authentication code").fill(await totp(secret, 1));
    await member.keyboard.press("Enter");
    // Signed in, back on the view the address names (#security, where the member was).
    await viewReady(member, "security");
    expect(await member.locator("#who-email").innerText()).toBe(MEMBER);
  });

  it("the member creates a key from the page with a daily budget and the decisions scope only; the secret is shown once", async () => {
    await member.getByRole("link", { name: "API keys" }).click();
    await viewReady(member, "keys");
    await member.getByLabel("Name (optional)").fill("alan-ci");
    await member.locator("#create-limits-details summary").click();
    await member.locator("#create-limits").getByLabel("Search", { exact: true }).uncheck();
    await member.locator("#create-limits").getByLabel("Budget (credits)").fill("0.032");
    await member.locator("#create-period").selectOption("day");
    await member.getByRole("button", { name: "Create key" }).click();
    await member.locator("#new-key:not([hidden])").waitFor();
    apiKey = await member.locator("#new-key-secret").innerText();
    expect(apiKey).toMatch(/^ts_live_[0-9A-Za-z]{49}$/);
    const row = member.locator("#keys-table tbody tr", { hasText: "alan-ci" });
    await row.getByText("decisions only · 0.032 credits a day").waitFor();
    expect(await seriousAxeFindings(member)).toEqual([]);
    await member.getByRole("button", { name: "I have stored it, hide it" }).click();
    expect(await member.content()).not.toContain(apiKey.slice(8));
  });

  it("the API holds the key to its limits: one decision fits the budget, the next is 402 KEY_BUDGET_EXCEEDED, a search is 403 KEY_SCOPE_DENIED", async () => {
    const first = await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey });
    expect(first.status).toBe(200);
    // The first call was charged: what is left no longer covers a one-question decision's hold (0.032).
    expect(refusal(await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey }))).toEqual([402, "KEY_BUDGET_EXCEEDED"]);
    expect(refusal(await postJson(`${service.url}/api/v1/search`, { q: "postgres vacuum", s: ["hackernews"] }, { apiKey }))).toEqual([403, "KEY_SCOPE_DENIED"]);
    expect(fakeSearch.requests()).toEqual([]);
    await member.reload();
    await viewReady(member, "keys");
    expect(await member.locator("#keys-table tbody tr", { hasText: "alan-ci" }).innerText()).toMatch(/0\.0\d+ spent/);
  });

  it("the owner removes the member after a confirmation; the member's next call finds the session gone", async () => {
    await owner.getByRole("link", { name: "Overview" }).click();
    await owner.getByRole("link", { name: "Team" }).click();
    await viewReady(owner, "team");
    const row = owner.locator("#members-table tbody tr", { hasText: MEMBER });
    expect(await row.innerText()).toContain("on");
    await row.getByRole("button", { name: `Remove ${MEMBER}` }).click();
    await owner.locator("#remove-dialog[open]").waitFor();
    await owner.getByRole("button", { name: "Remove member" }).click();
    await owner.locator("#members-table tbody tr", { hasText: MEMBER }).waitFor({ state: "detached" });

    await member.getByRole("link", { name: "Overview" }).click();
    await member.locator("#view-sign-in:not([hidden])").waitFor();
    const activity = await database.db("account_activity").orderBy("id").select("kind", "actor");
    expect(activity.slice(-2)).toEqual([
      { kind: "member_removed", actor: OWNER },
      { kind: "key_revoked", actor: OWNER },
    ]);
  });

  it("the removal revoked the member's key: it answers 401", async () => {
    expect(apiKey).toMatch(/^ts_live_/);
    expect(refusal(await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey }))).toEqual([401, "UNAUTHENTICATED"]);
  });

  it("ran under the page's own Content-Security-Policy without a refusal", () => {
    expect(policyViolations).toEqual([]);
  });
});
