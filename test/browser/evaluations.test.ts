import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bundleAccountPage } from "../../src/web/bundle-account-page.mjs";
import { inviteMember } from "../session-door/support.js";
import { createTestAccount, postJson, startTestApp, type TestApp } from "../support/app.js";
import { launchChromium, seriousAxeFindings } from "../support/browser.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { isProbe, logprobsReply, PROBE_OK, startFakeLlm, userContent, type FakeLlm } from "../support/fake-llm.js";
import { waitFor } from "../support/wait.js";

/**
 * An evaluation in the real browser: an owner uploads a JSON Lines file of
 * labelled states (and a CSV file), follows the progress until it finishes,
 * reads the metrics, the reliability diagram and the confusion matrix with
 * their tables, the largest errors, the label mass and what answered,
 * downloads the results CSV from its link, fits a calibration, and a decision through the API with a
 * key names it and gets raw and calibrated values. The fake upstream answers
 * with the documented response shape (fake-llm.ts), overconfident: P(yes)
 * 0.95 for every "refund" state, of which half are labelled false; the team
 * question leans to billing (option A) for refunds.
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
    const refund = userContent(request).includes("refund");
    if (userContent(request).includes("Which team")) return logprobsReply(refund ? { A: 0.9, B: 0.1 } : { A: 0.3, B: 0.7 }, { prompt: 100 });
    const p = refund ? 0.95 : 0.05;
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

/** Fills the evaluation form as a member would and presses Start. */
async function startEvaluation(questions: string, file: string, cap = "1"): Promise<void> {
  await page.getByLabel("Questions").fill(questions);
  await page.getByLabel("Examples (JSON Lines or CSV").setInputFiles(file);
  await page.getByLabel("Credit cap").fill(cap);
  await page.getByRole("button", { name: "Start" }).click();
}

describe("evaluations in a real browser", () => {
  it("uploads JSON Lines and CSV, follows the progress, shows the metrics, reliability diagram and confusion matrix, fits a calibration, and a decision names it", async () => {
    const account = await createTestAccount(database.db, { units: 5_000_000, name: "Acme" });
    const { token } = await inviteMember(database.db, account.accountId, "eve.evals@example.com", new Date(), "owner");
    await page.goto(`${service.url}/account/?invite=${token}`);
    await page.getByLabel("New password", { exact: true }).fill(PASSWORD);
    await page.getByLabel("New password, again").fill(PASSWORD);
    await page.keyboard.press("Enter");
    await viewReady("overview");

    // Teams: refunds 0–7 and parcels 10–11 are billing's, the rest shipping's; the fake reads billing for every refund.
    const team = (i: number) => (i < 8 || i === 10 || i === 11 ? "billing" : "shipping");
    const lines = Array.from({ length: 20 }, (_, i) =>
      JSON.stringify({ state: i < 10 ? `ticket ${i}: I want a refund` : `ticket ${i}: where is my parcel`, labels: { urgent: i < 5 || i >= 18, team: team(i) } }),
    );
    const file = path.join(dir, "tickets.jsonl");
    await fs.writeFile(file, lines.join("\n") + "\n");
    const questions = { urgent: { type: "noul", instructions: "Is it urgent?" }, team: { type: "choice", instructions: "Which team should answer?", criteria: { billing: null, shipping: null } } };

    await page.getByRole("link", { name: "Evaluations" }).click();
    await viewReady("evaluations");
    await startEvaluation(JSON.stringify(questions), file);
    const finished = page.locator('#evaluations-table tr[data-state="finished"]', { hasText: "tickets.jsonl" });
    await finished.waitFor();
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

    // What answered: the contract's model, the fake upstream's model, the prompt version.
    expect(await page.locator("#evaluation-answered-by").innerText()).toMatch(/^Answered by model typesafe\/service-[\d.]+, upstream fake-model, prompt version \S+\.$/);
    // The drill-down: the 7 wrong answers (0.95 on refunds 5–9 labelled false, 0.05 on parcels 18–19 labelled true) come first, by their line.
    const errors = await page.locator("#largest-errors-table tbody tr").evaluateAll((rows) => rows.map((r) => [...r.children].map((c) => c.textContent)));
    expect(errors.slice(0, 7).map(([, , , error]) => error)).toEqual(Array(7).fill("0.950"));
    expect(errors.slice(0, 7).map(([line, expected, predicted]) => [Number(line), expected, predicted]).sort((a, b) => (a[0] as number) - (b[0] as number))).toEqual([
      [6, "false", "true"],
      [7, "false", "true"],
      [8, "false", "true"],
      [9, "false", "true"],
      [10, "false", "true"],
      [19, "true", "false"],
      [20, "true", "false"],
    ]);
    expect(errors[7]![3]).toBe("0.050");
    const mass = await page.locator("#label-mass-table tbody tr td").allTextContents();
    expect(mass[0]).toBe("20");
    expect(mass.slice(1).every((cell) => /^[01]\.\d{3}$/.test(cell))).toBe(true);

    // The results download as the CSV the API and the CLI give: one line per question, the formula guard applied by the shared module.
    const [download] = await Promise.all([page.waitForEvent("download"), page.getByRole("link", { name: /^Download results \(CSV\) of tickets\.jsonl$/ }).click()]);
    const evaluationId = (await finished.getAttribute("data-id"))!;
    expect(download.suggestedFilename()).toBe(`evaluation-${evaluationId}.csv`);
    const downloaded = (await fs.readFile((await download.path())!, "utf8")).split("\r\n");
    expect(downloaded[0]).toBe("question,type,labelled,answered,accuracy,brier,log_loss,ece,auroc,macro_f1,mae_steps,model,upstream,prompt_version");
    expect(downloaded.slice(1, -1).map((line) => line.split(",").slice(0, 5))).toEqual([
      ["urgent", "noul", "20", "20", "0.65"],
      ["team", "choice", "20", "20", "0.8"],
    ]);
    // A noul question has no confusion matrix; the team question has one, drawn and tabled.
    expect(await page.locator("#confusion").isHidden()).toBe(true);
    await page.getByLabel("Question", { exact: true }).selectOption("team");
    await page.locator("#confusion:not([hidden])").waitFor();
    // Expected billing: 8 refunds read billing, 2 parcels read shipping; expected shipping: 2 refunds read billing, 8 parcels shipping.
    const confusion = await page.locator("#confusion-table tbody tr").evaluateAll((rows) => rows.map((r) => [...r.children].map((c) => c.textContent)));
    expect(confusion).toEqual([
      ["billing", "8", "2"],
      ["shipping", "2", "8"],
    ]);
    expect(await page.locator("#confusion-chart").boundingBox()).not.toBeNull();
    expect(await page.locator("#calibration-method option").allTextContents()).toEqual(["Temperature scaling", "Vector scaling (temperature and a bias per label)"]);

    // Fit Platt scaling on urgent; the list shows its held-out metrics before and after.
    await page.getByLabel("Question", { exact: true }).selectOption("urgent");
    await page.getByLabel("Method").selectOption("platt");
    await page.getByRole("button", { name: "Fit calibration" }).click();
    const fitted = page.locator('#calibrations-table tr[data-question="urgent"]');
    await fitted.waitFor();
    expect(await page.locator("#calibration-status").innerText()).toMatch(/^Fitted urgent, version 1: held-out ECE 0\.\d{3} before, 0\.\d{3} after\.$/);
    const cells = fitted.locator("td");
    expect([await cells.nth(1).innerText(), await cells.nth(2).innerText(), await cells.nth(7).innerText()]).toEqual(["platt", "1", "20"]);
    expect(await cells.nth(3).innerText()).toMatch(/^0\.\d{3} → 0\.\d{3}$/);
    const calibrationId = (await fitted.getAttribute("data-id"))!;

    // A decision through the API, with the account's key, names the calibration: raw and calibrated values side by side.
    const decided = await postJson(
      `${service.url}/api/v1/decisions`,
      { model: "typesafe/service-1.13", state: "ticket 99: I want a refund", questions: { urgent: { ...questions.urgent, calibration: calibrationId } } },
      { apiKey: account.apiKey },
    );
    expect(decided.status).toBe(200);
    const answer = (decided.body.data["answers"] as Record<string, Record<string, unknown>>)["urgent"]!;
    expect(answer["noul"]).toBeCloseTo(0.95, 6);
    const calibrated = answer["x_calibrated"] as { calibration_id: string; method: string; noul: number };
    expect([calibrated.calibration_id, calibrated.method]).toEqual([calibrationId, "platt"]);
    // Half the refunds were urgent: the calibrated reading moves from 0.95 towards 0.5.
    expect(calibrated.noul).toBeLessThan(0.9);

    // A CSV file goes through the same upload.
    const csv = path.join(dir, "tickets.csv");
    await fs.writeFile(csv, ["state,urgent,team", ...Array.from({ length: 20 }, (_, i) => `ticket ${i}: I want a refund,${i < 10},${i % 4 === 0 ? "" : team(i)}`)].join("\r\n") + "\r\n");
    await startEvaluation(JSON.stringify(questions), csv);
    const fromCsv = page.locator('#evaluations-table tr[data-state="finished"]', { hasText: "tickets.csv" });
    await fromCsv.waitFor();
    expect(await fromCsv.locator("td").nth(2).innerText()).toBe("20 / 20");

    // A bad line is named with its number and field, and nothing is started.
    const bad = path.join(dir, "bad.jsonl");
    await fs.writeFile(bad, [lines[0], JSON.stringify({ state: "x", labels: { urgent: "maybe" } })].join("\n"));
    await startEvaluation(JSON.stringify(questions), bad);
    await page.locator("#evaluations-error:not(:empty)").waitFor();
    expect(await page.locator("#evaluations-error").innerText()).toBe("line 2: labels.urgent: a noul label must be true or false");
    expect(await page.locator("#evaluations-table tbody tr").count()).toBe(2);
    expect(await seriousAxeFindings(page)).toEqual([]);
    expect(pageErrors).toEqual([]);
  });

  it("shows the bytes of a large upload going up on an accessible progress bar, then the run's progress and the runner's stop in the activity; resume, cancel and delete from the row", async () => {
    // About 1.2 MB of examples, sent at 256 KiB/s: Chromium's own network throttling (DevTools protocol) stretches the upload over seconds.
    const lines = Array.from({ length: 4_000 }, (_, i) => JSON.stringify({ state: `ticket ${i}: where is my parcel? ${"It was due last week and nobody answers. ".repeat(6)}`, labels: { urgent: i % 3 === 0 } }));
    const file = path.join(dir, "large.jsonl");
    await fs.writeFile(file, lines.join("\n") + "\n");
    const fileBytes = (await fs.stat(file)).size;
    const cdp = await context.newCDPSession(page);
    await cdp.send("Network.enable");
    await cdp.send("Network.emulateNetworkConditions", { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: 256 * 1024 });
    // Every state the bar goes through, recorded by the page itself as it changes.
    await page.evaluate(() => {
      const bar = document.getElementById("evaluation-upload-bar") as HTMLProgressElement;
      const steps: Array<{ value: number; max: number; text: string | null }> = [];
      (window as unknown as { uploadSteps: typeof steps }).uploadSteps = steps;
      new MutationObserver(() => steps.push({ value: bar.value, max: bar.max, text: bar.getAttribute("aria-valuetext") })).observe(bar, { attributes: true, attributeFilter: ["value", "max", "aria-valuetext"] });
    });

    // A cap of one unit: the first example does not fit, so the evaluation stops by itself at once.
    await startEvaluation(JSON.stringify({ urgent: { type: "noul", instructions: "Is it urgent?" } }), file, "0.000001");
    const bar = page.getByRole("progressbar", { name: "Upload of the examples file" });
    await page.waitForFunction(() => (document.getElementById("evaluation-upload-bar") as HTMLProgressElement).value > 0);
    expect(await bar.isVisible()).toBe(true);
    expect(await page.getByRole("button", { name: "Start" }).isDisabled()).toBe(true);
    expect(await page.locator("#evaluation-upload-status").innerText()).toMatch(/^Uploading large\.jsonl \(1\.\d MiB\)…$|^Sent large\.jsonl/);

    const stopped = page.locator('#evaluations-table tr[data-state="stopped"]', { hasText: "large.jsonl" });
    await stopped.waitFor({ timeout: 60_000 });
    await cdp.send("Network.emulateNetworkConditions", { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: -1 });
    const cells = stopped.locator("td");
    expect([await cells.nth(1).innerText(), await cells.nth(2).innerText(), await cells.nth(4).innerText()]).toEqual(["stopped (CREDIT_CAP)", "0 / 4000", "–"]);
    expect(await page.locator("#evaluation-upload").isHidden()).toBe(true);
    expect(await page.getByRole("button", { name: "Start" }).isEnabled()).toBe(true);

    const steps = await page.evaluate(() => (window as unknown as { uploadSteps: Array<{ value: number; max: number; text: string | null }> }).uploadSteps);
    const last = steps.at(-1)!;
    // The form's body: the file and the other fields, so a little more than the file.
    expect(last.max).toBeGreaterThan(fileBytes);
    expect(last.max).toBeLessThan(fileBytes + 4_096);
    expect(last.value).toBe(last.max);
    expect(last.text).toMatch(/^1\.\d MiB of 1\.\d MiB \(100 %\)$/);
    const between = steps.filter((step) => step.value > 0 && step.value < step.max && step.max === last.max);
    expect(between.length).toBeGreaterThanOrEqual(2);
    expect(between.every((step) => /^\d+(\.\d)? (KiB|MiB) of 1\.\d MiB \(\d{1,2} %\)$/.test(step.text ?? ""))).toBe(true);
    expect(new Set(steps.map((step) => step.value)).size).toBeGreaterThanOrEqual(4);

    // The runner's stop is in the activity, by the system, with what was spent against the cap.
    await page.getByRole("link", { name: "Activity" }).click();
    await viewReady("activity");
    const line = page.locator('#activity-table tr[data-kind="evaluation_stopped"]');
    await line.waitFor();
    const lineCells = line.locator("td");
    expect([await lineCells.nth(1).innerText(), await lineCells.nth(2).innerText()]).toEqual(["system", "stopped an evaluation"]);
    expect(await lineCells.nth(3).innerText()).toMatch(/: stopped by the evaluation runner: its credit cap was reached \(CREDIT_CAP\); 0 of 4000 examples run; charged 0 credits, cap 0\.000001 credits$/);
    expect(await seriousAxeFindings(page)).toEqual([]);

    // Resumed at the same cap it stops again at once: a second line by the system after the member's resume.
    await page.getByRole("link", { name: "Evaluations" }).click();
    await viewReady("evaluations");
    const id = (await stopped.getAttribute("data-id"))!;
    // Stopped before any answer: its results say so, and there is nothing to download.
    await stopped.getByRole("button", { name: "Results" }).click();
    await page.locator("#evaluation-answered-by", { hasText: "No example has been answered yet." }).waitFor();
    expect(await page.locator("#evaluation-results-csv").isHidden()).toBe(true);
    await stopped.getByRole("button", { name: "Resume large.jsonl" }).click();
    const dialog = page.getByRole("dialog", { name: "Resume this evaluation?" });
    expect(await dialog.getByText("its credit cap was reached. Raise the cap, or it stops again at once").count()).toBe(1);
    expect(await seriousAxeFindings(page)).toEqual([]);
    await dialog.getByRole("button", { name: "Resume" }).click();
    await waitFor(async () => (await database.db("account_activity").where({ kind: "evaluation_stopped" }).where("detail", "like", `${id}:%`)).length === 2, "the second stop");
    const kinds = await database.db("account_activity").where("detail", "like", `${id}:%`).orderBy("id").select("kind", "actor");
    expect(kinds).toEqual([
      { kind: "evaluation_created", actor: "eve.evals@example.com" },
      { kind: "evaluation_stopped", actor: "system" },
      { kind: "evaluation_resumed", actor: "eve.evals@example.com" },
      { kind: "evaluation_stopped", actor: "system" },
    ]);

    // Cancelled, then deleted, from its row, each after a confirmation.
    const row = page.locator(`#evaluations-table tr[data-id="${id}"]`);
    await page.locator(`#evaluations-table tr[data-id="${id}"][data-state="stopped"]`).waitFor();
    await row.getByRole("button", { name: "Cancel large.jsonl" }).click();
    await page.getByRole("dialog", { name: "Cancel this evaluation?" }).getByRole("button", { name: "Cancel evaluation" }).click();
    await page.locator(`#evaluations-table tr[data-id="${id}"][data-state="cancelled"]`).waitFor();
    expect(await row.getByRole("button", { name: "Resume large.jsonl" }).count()).toBe(0);
    await row.getByRole("button", { name: "Delete large.jsonl" }).click();
    await page.getByRole("dialog", { name: "Delete this evaluation?" }).getByRole("button", { name: "Delete evaluation" }).click();
    await row.waitFor({ state: "detached" });
    expect(await database.db("evaluations").where({ id })).toHaveLength(0);
    expect(pageErrors).toEqual([]);
  }, 120_000);
});
