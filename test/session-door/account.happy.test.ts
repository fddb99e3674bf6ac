import { toJson } from "@bufbuild/protobuf";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { ApiKeySchema } from "../../src/gen/typesafe/account/v1/account_service_pb.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestAccount, postJson } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { accountClient, inviteMember, startAccountApp, uniqueEmail, type AccountTestApp } from "./support.js";

/**
 * What a member does in the account area, end to end over Connect: accept an
 * invite, read the account, create a key and call the API with it, see the
 * call in usage and the summary, revoke the key, sign out.
 */
let database: TestDatabase;
let fake: FakeLlm;
let service: AccountTestApp;

beforeAll(async () => {
  database = await createTestDatabase();
  fake = await startFakeLlm();
  service = await startAccountApp(database, { TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`, TYPESAFE_LLM_MAX_RETRIES: "0" });
});
afterAll(async () => {
  await service?.stop();
  await fake?.close();
  await database?.close();
});

const decision = { model: "typesafe/service-1.13", state: "a state", questions: { q1: { type: "noul", instructions: "Yes?" } } };

describe("a member's account area", () => {
  it("accepts an invite, reads the balance, creates a key that the API takes, sees its call, revokes it", async () => {
    const { accountId } = await createTestAccount(database.db, { units: 2_000_000, freeRequests: 1, name: "acme" });
    const email = uniqueEmail("owner");
    const { token } = await inviteMember(database.db, accountId, email, service.clock.now());
    const { client, jar } = accountClient(service.url);

    const accepted = await client.acceptInvite({ inviteToken: token, password: "correct horse battery" });
    expect(accepted.member).toMatchObject({ email, accountId });
    expect(jar.received[0]).toMatch(/^typesafe_session=[A-Za-z0-9_-]{43}; Path=\/; HttpOnly; SameSite=Strict; Max-Age=43200$/);

    const { account, member } = await client.getAccount({});
    expect(member?.email).toBe(email);
    expect(account).toMatchObject({
      id: accountId,
      name: "acme",
      balanceCredits: 2,
      heldCredits: 0,
      availableCredits: 2,
      freeRequestsRemaining: 1,
      callsInFlight: 0,
      limits: { maxInFlight: 5, requestsPerMinute: 60 },
    });

    const created = await client.createKey({ name: "ci runner" });
    expect(created.secret).toMatch(/^ts_live_/);
    expect(created.key).toMatchObject({ name: "ci runner", prefix: "ts_live_", last4: created.secret.slice(-4), createdBy: email });
    expect(created.key?.lastUsedAt).toBeUndefined();

    const called = await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey: created.secret });
    expect(called.status).toBe(200);

    const { keys } = await client.listKeys({});
    const listed = keys.find((k) => k.id === created.key!.id)!;
    expect(listed.lastUsedAt).toBeDefined();
    expect(JSON.stringify(keys.map((k) => toJson(ApiKeySchema, k)))).not.toContain(created.secret.slice(8));
    const operatorKey = keys.find((k) => k.id !== created.key!.id)!;
    expect(operatorKey).toMatchObject({ createdBy: "operator" });

    const usage = await client.listUsage({});
    expect(usage.records).toHaveLength(1);
    expect(usage.records[0]).toMatchObject({ endpoint: "decide", keyId: created.key!.id, funding: "free", status: "settled", chargedCredits: 0 });
    expect(timestampDate(usage.records[0]!.startedAt!).getTime()).toBe(timestampDate(listed.lastUsedAt!).getTime());

    // The range ends at the service's clock, which this test holds still: a minute on, the call is inside it.
    service.clock.advance(60_000);
    const summary = await client.getUsageSummary({});
    expect(summary.buckets).toEqual([expect.objectContaining({ endpoint: "decide", calls: 1, chargedCredits: 0 })]);

    const revoked = await client.revokeKey({ keyId: created.key!.id });
    expect(revoked.key?.revokedAt).toBeDefined();
    expect((await postJson(`${service.url}/api/v1/decisions`, decision, { apiKey: created.secret })).status).toBe(401);

    const activity = await client.listActivity({});
    expect(activity.events.map((e) => [e.kind, e.actor])).toEqual([
      ["key_revoked", email],
      ["key_created", email],
      ["invite_accepted", email],
    ]);
    expect(activity.events[0]!.detail).toContain(created.secret.slice(-4));

    await client.signOut({});
    expect(jar.cookies.size).toBe(0);
  });
});
