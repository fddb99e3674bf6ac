import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestAccount, postJson } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { assertInvariants } from "../support/invariants.js";
import { checkAnswersOf } from "../support/openapi-conformance.js";
import { accountClient, inviteMember, refusal, startAccountApp, uniqueEmail, type AccountTestApp } from "./support.js";

/**
 * A member sets what each key may do (expiry, scopes, budget, rate limit) at
 * creation and later, and rolls a key, over Connect and the /account/v1 JSON
 * paths; the API then holds the key to it. A limit that breaks a rule is a
 * 400 naming the field; another account's key is NOT_FOUND.
 */
let database: TestDatabase;
let fake: FakeLlm;
let service: AccountTestApp;

beforeAll(async () => {
  database = await createTestDatabase();
  fake = await startFakeLlm();
  service = await startAccountApp(database, { TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_LLM_MAX_RETRIES: "0" });
  checkAnswersOf(service.url);
});
afterAll(async () => {
  await service?.stop();
  await fake?.close();
  await database?.close();
});

const decision = { model: "typesafe/service-1.13", state: "a state", questions: { q1: { type: "noul", instructions: "Yes?" } } };
const decide = (apiKey: string) => postJson(`${service.url}/api/v1/decisions`, decision, { apiKey });

async function signedIn(units = 2_000_000) {
  const { accountId } = await createTestAccount(database.db, { units });
  const email = uniqueEmail("keys");
  const { token } = await inviteMember(database.db, accountId, email, service.clock.now());
  const { client, jar } = accountClient(service.url);
  await client.acceptInvite({ inviteToken: token, password: "correct horse battery" });
  return { accountId, email, client, jar };
}

describe("a key's limits in the account area", () => {
  it("creates a key with a daily budget and the decisions scope; the page's figures follow its calls; search-only calls are refused", async () => {
    const { client, accountId } = await signedIn();
    const expiresAt = new Date(service.clock.now().getTime() + 86_400_000);
    const created = await client.createKey({
      name: "bounded",
      limits: { expiresAt: timestampFromDate(expiresAt), scopes: ["decisions"], budgetCredits: 0.032, budgetPeriod: "day", requestsPerMinute: 10 },
    });
    expect(created.key?.limits).toMatchObject({ scopes: ["decisions"], budgetCredits: 0.032, budgetPeriod: "day", requestsPerMinute: 10 });
    expect(timestampDate(created.key!.limits!.expiresAt!)).toEqual(expiresAt);
    expect(created.key?.budgetUsage).toMatchObject({ spentCredits: 0, heldCredits: 0, leftCredits: 0.032 });
    const start = timestampDate(created.key!.budgetUsage!.periodStart!);
    expect(start.toISOString()).toMatch(/T00:00:00\.000Z$/);
    expect(timestampDate(created.key!.budgetUsage!.periodEnd!).getTime() - start.getTime()).toBe(86_400_000);

    const first = await decide(created.secret);
    expect(first.status).toBe(200);
    const charged = (first.body.data as { billing: { charged_credits: number } }).billing.charged_credits;
    const listed = (await client.listKeys({})).keys.find((k) => k.id === created.key!.id)!;
    expect(listed.budgetUsage).toMatchObject({ spentCredits: charged, heldCredits: 0, leftCredits: Number((0.032 - charged).toFixed(6)) });
    // One more call's hold (0.032, the whole budget) no longer fits what is left: 402 with the key's own reason.
    const second = await decide(created.secret);
    expect([second.status, (second.body.data as { reason: string }).reason]).toEqual([402, "KEY_BUDGET_EXCEEDED"]);
    await assertInvariants(database.db, accountId);
  });

  it("updates the limits: a raised budget lets the key through again, counting what it spent today; removing limits lifts them", async () => {
    const { client } = await signedIn();
    const created = await client.createKey({ name: "tight", limits: { budgetCredits: 0.032, budgetPeriod: "day" } });
    expect((await decide(created.secret)).status).toBe(200);
    expect((await decide(created.secret)).status).toBe(402);
    const updated = await client.updateKey({ keyId: created.key!.id, limits: { budgetCredits: 1, budgetPeriod: "day", scopes: ["search"] } });
    expect(updated.key?.budgetUsage?.spentCredits).toBeGreaterThan(0);
    expect((await decide(created.secret)).body.data).toMatchObject({ reason: "KEY_SCOPE_DENIED" });
    await client.updateKey({ keyId: created.key!.id, limits: {} });
    const open = (await client.listKeys({})).keys.find((k) => k.id === created.key!.id)!;
    expect(open.limits).toMatchObject({ scopes: ["decisions", "search"], budgetPeriod: "", requestsPerMinute: 0 });
    expect(open.limits?.budgetCredits).toBeUndefined();
    expect(open.budgetUsage).toBeUndefined();
    expect((await decide(created.secret)).status).toBe(200);
  });

  it.each([
    ["an expiry in the past", { expiresAt: timestampFromDate(new Date(Date.now() - 1000)) }, "limits.expires_at"],
    ["an unknown scope", { scopes: ["admin"] }, "limits.scopes"],
    ["a budget without a period", { budgetCredits: 1 }, "limits.budget_period"],
    ["a period without a budget", { budgetPeriod: "day" }, "limits.budget_period"],
    ["an unknown period", { budgetCredits: 1, budgetPeriod: "year" }, "limits.budget_period"],
    ["a negative budget", { budgetCredits: -1, budgetPeriod: "day" }, "limits.budget_credits"],
    ["a budget finer than a unit", { budgetCredits: 0.0000001, budgetPeriod: "day" }, "limits.budget_credits"],
    ["a rate limit above the account's 60", { requestsPerMinute: 61 }, "limits.requests_per_minute"],
    ["a negative rate limit", { requestsPerMinute: -1 }, "limits.requests_per_minute"],
  ])("%s is a 400 naming %s, on create and on update", async (_name, limits, field) => {
    const { client } = await signedIn();
    const created = await refusal(client.createKey({ name: "x", limits }));
    expect([created.reason, created.field]).toEqual(["INVALID_ARGUMENT", field]);
    const key = await client.createKey({ name: "y" });
    const updated = await refusal(client.updateKey({ keyId: key.key!.id, limits }));
    expect([updated.reason, updated.field]).toEqual(["INVALID_ARGUMENT", field]);
  });

  it("another account's key, a revoked key and a malformed id are NOT_FOUND alike, for update and roll", async () => {
    const mine = await signedIn();
    const theirs = await signedIn();
    const theirKey = await theirs.client.createKey({ name: "theirs" });
    const revoked = await mine.client.createKey({ name: "gone" });
    await mine.client.revokeKey({ keyId: revoked.key!.id });
    for (const keyId of [theirKey.key!.id, revoked.key!.id, "not-a-uuid"]) {
      expect((await refusal(mine.client.updateKey({ keyId, limits: {} }))).reason).toBe("NOT_FOUND");
      expect((await refusal(mine.client.rollKey({ keyId, oldKeyExpiresInSeconds: 0 }))).reason).toBe("NOT_FOUND");
    }
    expect((await theirs.client.listKeys({})).keys[0]?.limits?.budgetCredits).toBeUndefined();
  });
});

describe("rolling a key", () => {
  it("the new secret works with the same limits; the old one works until its chosen stop, then answers KEY_EXPIRED", async () => {
    const { client } = await signedIn();
    const old = await client.createKey({ name: "ci", limits: { scopes: ["decisions"], requestsPerMinute: 30 } });
    const rolled = await client.rollKey({ keyId: old.key!.id, oldKeyExpiresInSeconds: 3600 });
    expect(rolled.secret).not.toBe(old.secret);
    expect(rolled.key).toMatchObject({ name: "ci", limits: { scopes: ["decisions"], requestsPerMinute: 30 } });
    expect(timestampDate(rolled.oldKey!.limits!.expiresAt!)).toEqual(new Date(service.clock.now().getTime() + 3_600_000));
    expect((await decide(rolled.secret)).status).toBe(200);
    expect((await decide(old.secret)).status).toBe(200);

    const now = await client.rollKey({ keyId: rolled.key!.id, oldKeyExpiresInSeconds: 0 });
    const refused = await decide(rolled.secret);
    expect([refused.status, (refused.body.data as { reason: string }).reason]).toEqual([401, "KEY_EXPIRED"]);
    expect((await decide(now.secret)).status).toBe(200);
    const activity = await client.listActivity({});
    expect(activity.events.filter((e) => e.kind === "key_rolled" && e.detail.includes("rolled from"))).toHaveLength(2);
  });

  it.each([-1, 604_801])("a grace of %s seconds is a 400 naming old_key_expires_in_seconds", async (seconds) => {
    const { client } = await signedIn();
    const key = await client.createKey({ name: "x" });
    const refused = await refusal(client.rollKey({ keyId: key.key!.id, oldKeyExpiresInSeconds: seconds }));
    expect([refused.reason, refused.field]).toEqual(["INVALID_ARGUMENT", "old_key_expires_in_seconds"]);
  });
});

describe("key changes in the activity list", () => {
  /** The key as the activity list names it: the first characters the page shows, the last 4, the name. */
  const labelOf = async (keyId: string) => {
    const key = await database.db("api_keys").where({ id: keyId }).first("display_prefix", "last4", "name");
    return `${key.display_prefix}…${key.last4} (${key.name})`;
  };

  it("each change of a key's limits and each roll names who did it and what changed; a save that changes nothing is not listed", async () => {
    const first = await signedIn();
    const second = uniqueEmail("keys");
    const { token } = await inviteMember(database.db, first.accountId, second, service.clock.now(), "admin");
    const other = accountClient(service.url);
    await other.client.acceptInvite({ inviteToken: token, password: "correct horse battery" });

    const created = await first.client.createKey({ name: "ci", limits: { scopes: ["decisions"] } });
    const label = await labelOf(created.key!.id);
    const expiresAt = new Date(Date.UTC(2030, 0, 1));
    await other.client.updateKey({
      keyId: created.key!.id,
      limits: { scopes: ["decisions"], budgetCredits: 0.5, budgetPeriod: "week", requestsPerMinute: 30, expiresAt: timestampFromDate(expiresAt) },
    });
    await first.client.updateKey({ keyId: created.key!.id, limits: { scopes: ["decisions", "search"], budgetCredits: 0.5, budgetPeriod: "week", requestsPerMinute: 30, expiresAt: timestampFromDate(expiresAt) } });
    // The same limits again: nothing changed, nothing listed.
    await first.client.updateKey({ keyId: created.key!.id, limits: { budgetCredits: 0.5, budgetPeriod: "week", requestsPerMinute: 30, expiresAt: timestampFromDate(expiresAt) } });
    const rolled = await other.client.rollKey({ keyId: created.key!.id, oldKeyExpiresInSeconds: 60 });
    const stopsAt = new Date(service.clock.now().getTime() + 60_000).toISOString();

    const events = (await first.client.listActivity({})).events.filter((e) => e.kind.startsWith("key_")).reverse();
    expect(events.map((e) => [e.kind, e.actor, e.detail])).toEqual([
      ["key_created", first.email, label],
      [
        "key_limits_changed",
        second,
        `${label}: expiry never → ${expiresAt.toISOString()}; budget none → 0.5 credits a week; rate limit the account's → 30 a minute`,
      ],
      ["key_limits_changed", first.email, `${label}: scopes decisions → decisions, search`],
      ["key_rolled", second, `${await labelOf(rolled.key!.id)}, rolled from ${label} (which stops at ${stopsAt})`],
    ]);
    // Removing every limit lists each one lifted.
    await first.client.updateKey({ keyId: rolled.key!.id, limits: {} });
    const [lifted] = (await first.client.listActivity({})).events;
    expect([lifted!.kind, lifted!.detail]).toEqual([
      "key_limits_changed",
      `${await labelOf(rolled.key!.id)}: expiry ${expiresAt.toISOString()} → never; budget 0.5 credits a week → none; rate limit 30 a minute → the account's`,
    ]);
  });
});

describe("the /account/v1 JSON paths", () => {
  it("update and roll take the same JSON names as the document", async () => {
    const { jar } = await signedIn();
    const cookie = [...jar.cookies].map(([n, v]) => `${n}=${v}`).join("; ");
    const post = async (path: string, body: unknown) => {
      const response = await fetch(`${service.url}${path}`, { method: "POST", headers: { "content-type": "application/json", cookie }, body: JSON.stringify(body) });
      return { status: response.status, body: (await response.json()) as { data: Record<string, unknown> } };
    };
    const created = await post("/account/v1/keys", { name: "json", limits: { budget_credits: 2, budget_period: "week", scopes: ["search"] } });
    expect(created.status).toBe(200);
    const key = created.body.data.key as { id: string; limits: Record<string, unknown> };
    expect(key.limits).toMatchObject({ budget_credits: 2, budget_period: "week", scopes: ["search"] });
    const updated = await post("/account/v1/keys/update", { key_id: key.id, limits: { requests_per_minute: 5 } });
    expect(updated.status).toBe(200);
    expect((updated.body.data.key as { limits: Record<string, unknown> }).limits).toMatchObject({ requests_per_minute: 5, scopes: ["decisions", "search"] });
    const bad = await post("/account/v1/keys/update", { key_id: key.id, limits: { requests_per_minute: 500 } });
    expect([bad.status, bad.body.data.field]).toEqual([400, "limits.requests_per_minute"]);
    const rolled = await post("/account/v1/keys/roll", { key_id: key.id, old_key_expires_in_seconds: 60 });
    expect(rolled.status).toBe(200);
    expect(rolled.body.data.secret).toMatch(/^ts_live_/);
  });
});

describe("usage by key", () => {
  it("ListUsage, the CSV and the summary filter by key; the summary groups by key; a malformed key id is a 400 naming key_id", async () => {
    const { client, jar } = await signedIn();
    const a = await client.createKey({ name: "a" });
    const b = await client.createKey({ name: "b" });
    for (const secret of [a.secret, a.secret, b.secret]) expect((await decide(secret)).status).toBe(200);
    const ofA = await client.listUsage({ keyId: a.key!.id });
    expect(ofA.records.map((r) => r.keyId)).toEqual([a.key!.id, a.key!.id]);
    expect((await client.listUsage({})).records).toHaveLength(3);

    const cookie = [...jar.cookies].map(([n, v]) => `${n}=${v}`).join("; ");
    const csv = await (await fetch(`${service.url}/account/v1/usage.csv?key_id=${b.key!.id}`, { headers: { cookie } })).text();
    expect(csv.trim().split("\r\n").slice(1).map((line) => line.split(",")[2])).toEqual([b.key!.id]);

    const until = timestampFromDate(new Date(Date.now() + 3_600_000));
    const grouped = await client.getUsageSummary({ until, groupByKey: true });
    expect(grouped.buckets.map((x) => [x.keyId, x.calls]).sort()).toEqual([[a.key!.id, 2], [b.key!.id, 1]].sort());
    const onlyB = await client.getUsageSummary({ until, keyId: b.key!.id });
    expect(onlyB.buckets.map((x) => [x.keyId, x.calls])).toEqual([["", 1]]);

    // One call at a time: a second call made up front could reject before anything awaits it.
    for (const call of [() => client.listUsage({ keyId: "nope" }), () => client.getUsageSummary({ keyId: "nope" })]) {
      const refused = await refusal(call());
      expect([refused.reason, refused.field]).toEqual(["INVALID_ARGUMENT", "key_id"]);
    }
  });
});
