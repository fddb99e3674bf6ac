import http from "node:http";
import zlib from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Role } from "../../src/team/roles.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { waitFor } from "../support/wait.js";
import { accountClient, inviteMember, startAccountApp, uniqueEmail, type AccountClient, type AccountTestApp } from "./support.js";

/**
 * The streamed upload of an examples file: 10,000 examples as JSON Lines or
 * CSV (gzip too) are stored whole; a bad line is named by number and field
 * and nothing is stored; a body past the bound is a 413, before or after
 * inflating; and the door refuses what it refuses on every account route.
 */
let database: TestDatabase;
let service: AccountTestApp;
const PATH = "/account/v1/evaluations/upload";
const QUESTIONS = {
  urgent: { type: "noul", instructions: "Is it urgent?" },
  team: { type: "choice", instructions: "Which team should answer?", criteria: { billing: null, support: null } },
};

beforeAll(async () => {
  database = await createTestDatabase();
  service = await startAccountApp(database);
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

async function signedIn(role: Role = "member", accountId?: string): Promise<{ accountId: string; cookie: string; client: AccountClient }> {
  const account = accountId ?? (await createTestAccount(database.db, { units: 1_000_000 })).accountId;
  const { token } = await inviteMember(database.db, account, uniqueEmail(role), service.clock.now(), role);
  const { client, jar } = accountClient(service.url);
  await client.acceptInvite({ inviteToken: token, password: "a long and unusual passphrase 42" });
  return { accountId: account, cookie: `typesafe_session=${jar.cookies.get("typesafe_session")}`, client };
}

function jsonLines(count: number, bad: Record<number, string> = {}): string {
  const lines: string[] = [];
  for (let i = 1; i <= count; i++) {
    lines.push(bad[i] ?? JSON.stringify({ state: { ticket: `ticket ${i}`, amount: i }, labels: i % 3 === 0 ? { urgent: i % 2 === 0 } : { urgent: i % 2 === 0, team: i % 5 === 0 ? "billing" : "support" } }));
  }
  return lines.join("\n") + "\n";
}

function form(file: string, filename: string, fields: Record<string, string> = {}): FormData {
  const body = new FormData();
  body.set("name", "uploaded");
  body.set("questions", JSON.stringify(QUESTIONS));
  body.set("credit_cap_credits", "2.5");
  for (const [name, value] of Object.entries(fields)) body.set(name, value);
  body.set("examples", new Blob([file]), filename);
  return body;
}

async function upload(cookie: string | undefined, body: FormData, headers: Record<string, string> = {}) {
  const response = await fetch(`${service.url}${PATH}`, { method: "POST", body, headers: { ...(cookie ? { cookie } : {}), ...headers } });
  return { status: response.status, json: (await response.json()) as { code: number; message: string; data: Record<string, unknown> & { reason?: string; field?: string; rule?: string; metadata?: Record<string, string> } } };
}

async function storedEvaluations(accountId: string): Promise<number> {
  const rows = await database.db("evaluations").where({ account_id: accountId }).select("id");
  return rows.length;
}

describe("a JSON Lines or CSV file of 10,000 examples", () => {
  it("JSON Lines: stored whole, in the member's account, with the fields as CreateEvaluation takes them", async () => {
    const member = await signedIn();
    const { status, json } = await upload(member.cookie, form(jsonLines(10_000), "tickets.jsonl", { examples_in_flight: "3" }));
    expect(status).toBe(200);
    const evaluation = json.data["evaluation"] as { id: string; name: string; progress: { total: number }; credit_cap_credits: number; examples_in_flight: number; question_keys: string[]; created_by: string };
    expect([evaluation.name, evaluation.progress.total, evaluation.credit_cap_credits, evaluation.examples_in_flight, evaluation.question_keys]).toEqual(["uploaded", 10_000, 2.5, 3, ["urgent", "team"]]);
    const rows = await database.db("evaluation_examples").where({ evaluation_id: evaluation.id }).orderBy("position").select("position", "state", "labels");
    expect(rows).toHaveLength(10_000);
    expect(rows[4]).toMatchObject({ position: 5, state: { ticket: "ticket 5", amount: 5 }, labels: { urgent: false, team: "billing" } });
    expect(rows[5]!.labels).toEqual({ urgent: true });
    const { evaluations } = await member.client.listEvaluations({});
    expect(evaluations.map((e) => e.id)).toEqual([evaluation.id]);
  });

  it("CSV, gzip-compressed: stored whole; an empty cell labels nothing", async () => {
    const member = await signedIn();
    const lines = ["state,urgent,team"];
    for (let i = 1; i <= 10_000; i++) lines.push(`"ticket ${i}, said ""help""",${i % 2 === 0},${i % 3 === 0 ? "" : "billing"}`);
    const request = new Request(`${service.url}${PATH}`, { method: "POST", body: form(lines.join("\r\n") + "\r\n", "tickets.csv") });
    const compressed = zlib.gzipSync(Buffer.from(await request.arrayBuffer()));
    const response = await fetch(`${service.url}${PATH}`, {
      method: "POST",
      body: compressed,
      headers: { cookie: member.cookie, "content-type": request.headers.get("content-type")!, "content-encoding": "gzip" },
    });
    expect(response.status).toBe(200);
    const { data } = (await response.json()) as { data: { evaluation: { id: string; progress: { total: number } } } };
    expect(data.evaluation.progress.total).toBe(10_000);
    const third = await database.db("evaluation_examples").where({ evaluation_id: data.evaluation.id, position: 4 }).first("state", "labels");
    expect(third).toEqual({ state: 'ticket 3, said "help"', labels: { urgent: false } });
  });
});

describe("bad input: named, and nothing stored", () => {
  it("bad lines are each named with their line number and field; no evaluation is stored", async () => {
    const member = await signedIn();
    const file = jsonLines(10_000, {
      4321: JSON.stringify({ state: "refund please", labels: { urgent: "yes" } }),
      9000: JSON.stringify({ state: "refund please", labels: { team: "sales" } }),
      9999: "{not json",
    });
    const { status, json } = await upload(member.cookie, form(file, "tickets.jsonl"));
    expect(status).toBe(400);
    expect([json.data.reason, json.data.field, json.data.rule]).toEqual(["INVALID_ARGUMENT", "line 9999", "must be one JSON object"]);
    // The parse's own violations come first; the examples' rules are checked once every line parses.
    const fixed = jsonLines(10_000, { 4321: JSON.stringify({ state: "refund please", labels: { urgent: "yes" } }), 9000: JSON.stringify({ state: "refund please", labels: { team: "sales" } }) });
    const second = await upload(member.cookie, form(fixed, "tickets.jsonl"));
    expect(second.status).toBe(400);
    expect([second.json.data.field, second.json.data.rule]).toEqual(["line 4321: labels.urgent", "a noul label must be true or false"]);
    expect(second.json.data.metadata!["violations"]!.split("\n")).toEqual([
      "line 4321: labels.urgent: a noul label must be true or false",
      'line 9000: labels.team: must be one of the options: "billing", "support"',
    ]);
    expect(await storedEvaluations(member.accountId)).toBe(0);
  });

  it("a CSV line with a missing cell is named by its line (quoted newlines count)", async () => {
    const member = await signedIn();
    const file = 'state,urgent,team\n"two\nlines",true,billing\nshort,true\n';
    const { status, json } = await upload(member.cookie, form(file, "tickets.csv"));
    expect([status, json.data.field, json.data.rule]).toEqual([400, "line 4", "has 2 cells; the header has 3"]);
    expect(await storedEvaluations(member.accountId)).toBe(0);
  });

  it("the fields: by CreateEvaluation's rules and names; a file that is neither JSON Lines nor CSV; no file", async () => {
    const member = await signedIn();
    const cases: Array<[FormData, string, string]> = [
      [form(jsonLines(2), "tickets.jsonl", { credit_cap_credits: "0" }), "credit_cap_credits", "must be above 0, with at most 6 decimals"],
      [form(jsonLines(2), "tickets.jsonl", { questions: "{" }), "questions", "a JSON object of question key to question, as a decision takes them"],
      [form(jsonLines(2), "tickets.jsonl", { questions: JSON.stringify({ urgent: { type: "noul" } }) }), "questions.urgent.instructions", "must be a non-empty string"],
      [form(jsonLines(2), "tickets.xlsx"), "examples", "a .jsonl (JSON Lines) or .csv file"],
      [form(jsonLines(2), "tickets.jsonl", { account_id: "00000000-0000-0000-0000-000000000000" }), "account_id", "not a field of the upload (name, questions, credit_cap_credits, examples_in_flight, then the examples file)"],
    ];
    const noFile = new FormData();
    noFile.set("questions", JSON.stringify(QUESTIONS));
    cases.push([noFile, "examples", "required: a .jsonl or .csv file part, after the other fields"]);
    for (const [body, field, rule] of cases) {
      const { status, json } = await upload(member.cookie, body);
      expect([status, json.data.reason, json.data.field, json.data.rule]).toEqual([400, "INVALID_ARGUMENT", field, expect.stringContaining(rule)]);
    }
    const notForm = await fetch(`${service.url}${PATH}`, { method: "POST", body: jsonLines(2), headers: { cookie: member.cookie, "content-type": "application/jsonl" } });
    expect([notForm.status, ((await notForm.json()) as { data: { field: string } }).data.field]).toEqual([415, "content-type"]);
    expect(await storedEvaluations(member.accountId)).toBe(0);
  });
});

describe("a body past the bound", () => {
  it("413 at once from a declared Content-Length over 64 MiB, before any of it is read", async () => {
    const member = await signedIn();
    const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = http.request(`${service.url}${PATH}`, {
        method: "POST",
        headers: { cookie: member.cookie, "content-type": "multipart/form-data; boundary=x", "content-length": String(64 * 1024 * 1024 + 1) },
      });
      req.on("response", (res) => {
        let body = "";
        res.on("data", (chunk: Buffer) => (body += chunk.toString()));
        res.on("end", () => {
          req.destroy();
          resolve({ status: res.statusCode!, body });
        });
      });
      req.on("error", reject);
      req.flushHeaders();
    });
    expect(answer.status).toBe(413);
    expect(JSON.parse(answer.body).data).toMatchObject({ reason: "PAYLOAD_TOO_LARGE", field: "body", rule: `at most ${64 * 1024 * 1024} bytes` });
  });

  it("413 for a small gzip body that inflates past 64 MiB; nothing stored", async () => {
    const member = await signedIn();
    const request = new Request(`${service.url}${PATH}`, { method: "POST", body: form(`${" ".repeat(1023)}\n`.repeat(65 * 1024), "bomb.jsonl") });
    const compressed = zlib.gzipSync(Buffer.from(await request.arrayBuffer()));
    expect(compressed.byteLength).toBeLessThan(1024 * 1024);
    const response = await fetch(`${service.url}${PATH}`, {
      method: "POST",
      body: compressed,
      headers: { cookie: member.cookie, "content-type": request.headers.get("content-type")!, "content-encoding": "gzip" },
    });
    expect(response.status).toBe(413);
    expect(((await response.json()) as { data: { reason: string } }).data.reason).toBe("PAYLOAD_TOO_LARGE");
    expect(await storedEvaluations(member.accountId)).toBe(0);
  });

  it("an encoding the service does not take: 415 listing the accepted ones", async () => {
    const member = await signedIn();
    const response = await fetch(`${service.url}${PATH}`, { method: "POST", body: form(jsonLines(2), "a.jsonl"), headers: { cookie: member.cookie, "content-encoding": "zstd" } });
    expect([response.status, response.headers.get("accept-encoding")]).toEqual([415, "gzip,br"]);
  });
});

describe("uploads at once", () => {
  it("while two uploads are being read, a third is 429 UPLOADS_BUSY with Retry-After before its body is read; once they end, uploads go through again", async () => {
    const member = await signedIn();
    // Three uploads send their fields and the start of the file, then hold the body open: the two
    // counted first are read (and never end), so exactly one is answered, and it is the refusal.
    const held = [1, 2, 3].map(() => {
      const req = http.request(`${service.url}${PATH}`, { method: "POST", headers: { cookie: member.cookie, "content-type": "multipart/form-data; boundary=held" } });
      const answered = new Promise<{ status: number; retryAfter: string | undefined; body: string }>((resolve) => {
        req.on("response", (res) => {
          let body = "";
          res.on("data", (chunk: Buffer) => (body += chunk.toString()));
          res.on("end", () => resolve({ status: res.statusCode!, retryAfter: res.headers["retry-after"], body }));
        });
      });
      req.on("error", () => {});
      req.write(`--held\r\ncontent-disposition: form-data; name="questions"\r\n\r\n${JSON.stringify(QUESTIONS)}\r\n`);
      req.write(`--held\r\ncontent-disposition: form-data; name="credit_cap_credits"\r\n\r\n1\r\n`);
      req.write(`--held\r\ncontent-disposition: form-data; name="examples"; filename="held.jsonl"\r\n\r\n${jsonLines(1)}`);
      return { req, answered };
    });
    const refused = await Promise.race(held.map((h) => h.answered));
    expect(refused.status).toBe(429);
    expect(refused.retryAfter).toBe("10");
    expect(JSON.parse(refused.body).data).toMatchObject({ reason: "UPLOADS_BUSY" });
    for (const { req } of held) req.destroy();
    await waitFor(async () => (await upload(member.cookie, form(jsonLines(2), "tickets.jsonl"))).status === 200, "an upload to go through once the held ones ended");
  });
});

describe("the door", () => {
  it("no session: 401 SIGNED_OUT; a viewer: 403 ROLE_FORBIDDEN; another site's page: 403 CROSS_SITE_REFUSED; nothing stored", async () => {
    const owner = await signedIn("owner");
    const viewer = await signedIn("viewer", owner.accountId);
    const cases: Array<[string | undefined, Record<string, string>, number, string]> = [
      [undefined, {}, 401, "SIGNED_OUT"],
      ["typesafe_session=not-a-session", {}, 401, "SIGNED_OUT"],
      [viewer.cookie, {}, 403, "ROLE_FORBIDDEN"],
      [owner.cookie, { origin: "https://evil.example" }, 403, "CROSS_SITE_REFUSED"],
      [owner.cookie, { "sec-fetch-site": "cross-site" }, 403, "CROSS_SITE_REFUSED"],
    ];
    for (const [cookie, headers, status, reason] of cases) {
      const answer = await upload(cookie, form(jsonLines(2), "a.jsonl"), headers);
      expect([answer.status, answer.json.data.reason]).toEqual([status, reason]);
    }
    expect(await storedEvaluations(owner.accountId)).toBe(0);
    const get = await fetch(`${service.url}${PATH}`, { headers: { cookie: owner.cookie } });
    expect([get.status, get.headers.get("allow")]).toEqual([405, "POST"]);
  });

  it("an upload lands in the uploader's own account only", async () => {
    const mine = await signedIn();
    const theirs = await signedIn();
    const { json } = await upload(theirs.cookie, form(jsonLines(3), "a.jsonl"));
    const id = (json.data["evaluation"] as { id: string }).id;
    expect((await mine.client.listEvaluations({})).evaluations).toEqual([]);
    expect((await theirs.client.listEvaluations({})).evaluations.map((e) => e.id)).toEqual([id]);
    expect(await storedEvaluations(mine.accountId)).toBe(0);
  });
});
