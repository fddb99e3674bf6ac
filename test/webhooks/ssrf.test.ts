import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { classifyAddress, refusalOf } from "../../src/webhooks/address-check.js";
import { listDeliveries, sendTestEvent } from "../../src/webhooks/deliveries.js";
import { endpointUrlViolations } from "../../src/webhooks/endpoint-url.js";
import { createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { startDnsServer } from "../support/dns-server.js";
import { waitFor } from "../support/wait.js";
import { loopbackOnly, startWebhookReceiver, type WebhookReceiver } from "../support/webhook-receiver.js";

/**
 * Server-side request forgery: the address check as a table, the URL check,
 * and end to end through the real service, whose connect hook here refuses
 * anything but loopback, so a check that failed open fails the test before a
 * packet leaves. Names resolve through a DNS server on loopback.
 */
describe("the address check", () => {
  it.each([
    ["10.0.0.1", "private"],
    ["10.255.255.255", "private"],
    ["172.16.0.1", "private"],
    ["172.31.255.254", "private"],
    ["192.168.0.1", "private"],
    ["100.64.0.1", "private"],
    ["169.254.169.254", "metadata"],
    ["169.254.10.1", "link-local"],
    ["fd00:ec2::254", "metadata"],
    ["127.0.0.1", "loopback"],
    ["127.8.9.10", "loopback"],
    ["::1", "loopback"],
    ["0.0.0.0", "reserved"],
    ["::", "reserved"],
    ["fc00::1", "private"],
    ["fdff:ffff::1", "private"],
    ["fe80::1", "link-local"],
    ["fe80::1%lo", "link-local"],
    ["224.0.0.251", "multicast"],
    ["ff02::1", "multicast"],
    ["255.255.255.255", "reserved"],
    ["::ffff:127.0.0.1", "loopback"],
    ["::ffff:7f00:1", "loopback"],
    ["::ffff:10.0.0.1", "private"],
    ["::ffff:169.254.169.254", "metadata"],
    ["::ffff:192.168.1.1", "private"],
    ["64:ff9b::a9fe:a9fe", "metadata"],
    ["2002:c0a8:101::1", "private"],
    ["172.32.0.1", "public"],
    ["172.15.255.255", "public"],
    ["192.169.0.1", "public"],
    ["11.0.0.1", "public"],
    ["8.8.8.8", "public"],
    ["2606:4700:4700::1111", "public"],
    ["::ffff:8.8.8.8", "public"],
    ["not an address", "invalid"],
  ])("%s is %s", (address, kind) => {
    expect(classifyAddress(address)).toBe(kind);
    expect(refusalOf(address, false) === undefined).toBe(kind === "public");
  });

  it("the operator's loopback setting lets loopback through and nothing else", () => {
    expect(refusalOf("127.0.0.1", true)).toBeUndefined();
    expect(refusalOf("::1", true)).toBeUndefined();
    expect(refusalOf("::ffff:127.0.0.1", true)).toBeUndefined();
    expect(refusalOf("10.0.0.1", true)).toBe("10.0.0.1 is a private address");
    expect(refusalOf("169.254.169.254", true)).toBe("169.254.169.254 is a metadata address");
  });
});

describe("the URL check", () => {
  it.each([
    ["", "must not be empty"],
    ["hooks.example.com/x", "must be an absolute http:// or https:// URL"],
    ["ftp://hooks.example.com/", "must be an http:// or https:// URL"],
    ["https://user:pw@hooks.example.com/", "must not hold credentials"],
    ["https://hooks.example.com/#x", "must not have a fragment"],
    ["http://127.0.0.1:8080/", "must reach a public address (127.0.0.1 is a loopback address)"],
    ["http://[::1]/", "must reach a public address (::1 is a loopback address)"],
    ["http://localhost/", "must reach a public address (localhost is loopback)"],
    ["http://localhost./", "must reach a public address (localhost. is loopback)"],
    ["http://LocalHost.:8080/", "must reach a public address (localhost. is loopback)"],
    ["http://hooks.localhost./", "must reach a public address (hooks.localhost. is loopback)"],
    ["http://10.1.2.3/", "must reach a public address (10.1.2.3 is a private address)"],
    ["http://169.254.169.254/latest/meta-data/", "must reach a public address (169.254.169.254 is a metadata address)"],
    ["http://[::ffff:a9fe:a9fe]/", "must reach a public address (::ffff:a9fe:a9fe is a metadata address)"],
    [`https://hooks.example.com/${"a".repeat(2048)}`, "must be at most 2048 characters"],
  ])("%s: %s", (url, rule) => {
    expect(endpointUrlViolations("url", url, false)).toEqual([{ field: "url", rule }]);
  });

  it("a public name or address passes; loopback passes only when allowed", () => {
    expect(endpointUrlViolations("url", "https://hooks.example.com/typesafe?x=1", false)).toEqual([]);
    expect(endpointUrlViolations("url", "http://8.8.8.8/", false)).toEqual([]);
    expect(endpointUrlViolations("url", "http://127.0.0.1:9/", true)).toEqual([]);
    expect(endpointUrlViolations("url", "http://localhost./", true)).toEqual([]);
    expect(endpointUrlViolations("url", "http://localhost.example.com/", false)).toEqual([]);
  });
});

describe("end to end, loopback not allowed", () => {
  let database: TestDatabase;
  let service: TestApp;
  let receiver: WebhookReceiver;
  let dns: Awaited<ReturnType<typeof startDnsServer>>;
  const guard = loopbackOnly();

  beforeAll(async () => {
    database = await createTestDatabase(6, { countsDeliveries: true });
    dns = await startDnsServer({
      "loopback.hooks.test": ["127.0.0.1"],
      "private.hooks.test": ["10.0.0.7"],
      "mixed.hooks.test": ["127.0.0.1", "203.0.114.9"],
      "metadata.hooks.test": ["169.254.169.254"],
      "ula.hooks.test": ["fd00::5"],
    });
    service = await startTestApp(
      database,
      { TYPESAFE_WEBHOOK_POLL_MS: "20", TYPESAFE_WEBHOOK_RETRY_DELAYS_MS: "60000", TYPESAFE_WEBHOOK_DNS_SERVERS: dns.address },
      { overrides: { webhookBeforeConnect: guard.hook } },
    );
    receiver = await startWebhookReceiver();
  });
  afterAll(async () => {
    await service?.stop();
    await receiver?.close();
    await dns?.close();
    await database?.close();
  });

  const port = () => new URL(receiver.url).port;
  it.each([
    ["127.0.0.1", () => `http://127.0.0.1:${port()}/hooks`, /127\.0\.0\.1 is a loopback address/],
    ["[::1]", () => `http://[::1]:${port()}/hooks`, /::1 is a loopback address/],
    ["localhost. (the root's trailing dot), by the same rule as when added", () => `http://localhost.:${port()}/hooks`, /refused: localhost\. is loopback/],
    ["a name resolving to loopback", () => `http://loopback.hooks.test:${port()}/hooks`, /loopback\.hooks\.test resolves to 127\.0\.0\.1 is a loopback address/],
    ["a name with one loopback address among others", () => `http://mixed.hooks.test:${port()}/hooks`, /resolves to 127\.0\.0\.1 is a loopback address/],
    ["a name resolving to a private address", () => `http://private.hooks.test/hooks`, /resolves to 10\.0\.0\.7 is a private address/],
    ["a name resolving to the metadata service", () => `http://metadata.hooks.test/latest`, /resolves to 169\.254\.169\.254 is a metadata address/],
    ["a name resolving to a unique local IPv6 address", () => `http://ula.hooks.test/hooks`, /resolves to fd00::5 is a private address/],
  ])("%s is refused at delivery, before any connection", async (_name, url, error) => {
    const { accountId } = await createTestAccount(database.db);
    // Stored directly, as a URL that passed its check when it was added may resolve elsewhere by now.
    const [endpoint] = await database.db("webhook_endpoints").insert({ account_id: accountId, url: url(), secret: "whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0dGVzdA==" }).returning("id");
    const received = receiver.received.length;
    await sendTestEvent(database.db, accountId, endpoint.id);
    service.app.deliverer.wake();
    await waitFor(async () => ((await listDeliveries(database.db, accountId, 1))[0]?.attempts.length ?? 0) > 0, "the refused attempt");
    const [delivery] = await listDeliveries(database.db, accountId, 1);
    expect(delivery!.attempts[0]).toMatchObject({ status: undefined, error: expect.stringMatching(error) });
    expect(delivery!.state).toBe("pending");
    expect(receiver.received.length).toBe(received);
    expect(guard.seen).toEqual([]);
  });
});

describe("end to end, loopback allowed (development)", () => {
  let database: TestDatabase;
  let service: TestApp;
  let receiver: WebhookReceiver;
  let elsewhere: WebhookReceiver;
  let dns: Awaited<ReturnType<typeof startDnsServer>>;
  const guard = loopbackOnly();

  beforeAll(async () => {
    database = await createTestDatabase(6, { countsDeliveries: true });
    dns = await startDnsServer({ "loopback.hooks.test": ["127.0.0.1"] });
    service = await startTestApp(
      database,
      { TYPESAFE_WEBHOOK_ALLOW_LOOPBACK: "on", TYPESAFE_WEBHOOK_POLL_MS: "20", TYPESAFE_WEBHOOK_RETRY_DELAYS_MS: "60000", TYPESAFE_WEBHOOK_DNS_SERVERS: dns.address },
      { overrides: { webhookBeforeConnect: guard.hook } },
    );
    receiver = await startWebhookReceiver();
    elsewhere = await startWebhookReceiver();
  });
  afterAll(async () => {
    await service?.stop();
    await receiver?.close();
    await elsewhere?.close();
    await dns?.close();
    await database?.close();
  });

  it("a name is resolved through the configured resolver and the connection goes to the address it checked", async () => {
    const { accountId } = await createTestAccount(database.db);
    const url = `http://loopback.hooks.test:${new URL(receiver.url).port}/hooks`;
    const [endpoint] = await database.db("webhook_endpoints").insert({ account_id: accountId, url, secret: "whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0dGVzdA==" }).returning("id");
    await sendTestEvent(database.db, accountId, endpoint.id);
    await waitFor(async () => (await listDeliveries(database.db, accountId, 1))[0]?.state === "delivered", "delivered");
    expect(dns.queries).toContain("loopback.hooks.test A");
    expect(guard.seen).toEqual(["127.0.0.1"]);
  });

  it("a redirect is not followed: a 302 to another loopback server is a failed attempt and that server hears nothing", async () => {
    const { accountId } = await createTestAccount(database.db);
    receiver.answer = () => ({ status: 302, headers: { location: elsewhere.url } });
    const [endpoint] = await database.db("webhook_endpoints").insert({ account_id: accountId, url: receiver.url, secret: "whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0dGVzdA==" }).returning("id");
    await sendTestEvent(database.db, accountId, endpoint.id);
    await waitFor(async () => ((await listDeliveries(database.db, accountId, 1))[0]?.attempts.length ?? 0) > 0, "the attempt");
    const [delivery] = await listDeliveries(database.db, accountId, 1);
    expect(delivery!.attempts[0]!.status).toBe(302);
    expect(delivery!.state).toBe("pending");
    expect(elsewhere.received).toEqual([]);
  });
});

describe("the start log", () => {
  it.each([
    ["on", 1],
    ["off", 0],
  ])("with TYPESAFE_WEBHOOK_ALLOW_LOOPBACK=%s, a warning that webhooks may reach loopback appears %i time(s)", async (setting, times) => {
    const database = await createTestDatabase();
    const lines: Record<string, unknown>[] = [];
    const service = await startTestApp(database, { TYPESAFE_LOG_LEVEL: "info", TYPESAFE_WEBHOOK_ALLOW_LOOPBACK: setting }, { onLogLine: (line) => lines.push(JSON.parse(line)) });
    await service.stop();
    await database.close();
    const warnings = lines.filter((line) => line["msg"] === "webhooks may reach loopback");
    expect(warnings).toHaveLength(times);
    for (const warning of warnings) expect([warning["level"], warning["setting"]]).toEqual(["warn", "TYPESAFE_WEBHOOK_ALLOW_LOOPBACK=on"]);
  });
});
