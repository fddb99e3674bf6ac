import crypto from "node:crypto";
import { afterAll, beforeAll, expect, it } from "vitest";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";

/**
 * The database itself refuses an account, request or ledger row that breaks
 * a metering rule, whatever code writes it: each rule below is pinned by a
 * write that breaks only it, refused with check_violation (23514) naming the
 * rule, and leaving the row as it was. One-column rules are domains
 * (migration 20261125100000_metering_rules_as_domains), two-column rules
 * CHECK constraints.
 */
let database: TestDatabase;
let accountId: string;
let requestId: string;
beforeAll(async () => {
  database = await createTestDatabase(2);
  ({ accountId } = await createTestAccount(database.db, { units: 1_000, freeRequests: 2 }));
  requestId = crypto.randomUUID();
  const now = new Date("2031-03-01T12:00:00.417Z");
  await database.db("requests").insert({
    id: requestId,
    account_id: accountId,
    endpoint: "decide",
    funding: "paid",
    reserved: 100,
    status: "settled",
    charged: 40,
    created_at: now,
    lease_expires_at: now,
  });
  await database.db("ledger").insert({ account_id: accountId, request_id: requestId, kind: "hold", amount: 100, at: now });
});
afterAll(async () => {
  await database?.close();
});

const broken: Array<[table: "accounts" | "requests" | "ledger", change: Record<string, unknown>, rule: string]> = [
  ["accounts", { balance: -1, reserved: 0 }, "metering_units_not_negative"],
  ["accounts", { reserved: -1 }, "metering_units_not_negative"],
  ["accounts", { free_remaining: -1, free_reserved: -1 }, "metering_count_not_negative"],
  ["accounts", { free_reserved: -1 }, "metering_count_not_negative"],
  ["accounts", { in_flight: -1 }, "metering_count_not_negative"],
  ["accounts", { max_in_flight: 0, in_flight: 0 }, "metering_limit_positive"],
  ["accounts", { rate_limit: 0 }, "metering_limit_positive"],
  ["accounts", { rate_window_ms: 0 }, "metering_limit_positive"],
  ["accounts", { reserved: 1_001 }, "accounts_check"],
  ["accounts", { free_reserved: 3 }, "accounts_check1"],
  ["accounts", { in_flight: 6 }, "accounts_check2"],
  ["requests", { endpoint: "translate" }, "metering_endpoint_known"],
  ["requests", { funding: "credit" }, "metering_funding_known"],
  ["requests", { status: "pending" }, "metering_status_known"],
  ["requests", { reserved: -1, charged: 0 }, "metering_units_not_negative"],
  ["requests", { charged: -1 }, "metering_units_not_negative"],
  ["requests", { charged: 101 }, "requests_check"],
  ["requests", { funding: "free" }, "requests_check1"],
  ["ledger", { kind: "refund" }, "metering_entry_kind_known"],
  ["ledger", { amount: -1 }, "metering_units_not_negative"],
  ["ledger", { free_units: -1 }, "metering_count_not_negative"],
  ["ledger", { kind: "grant" }, "ledger_check"],
];

it.each(broken)("%s: %o is refused by %s", async (table, change, rule) => {
  const where = table === "accounts" ? { id: accountId } : table === "requests" ? { id: requestId } : { request_id: requestId };
  const before = await database.db(table).where(where).first();
  await expect(database.db(table).where(where).update(change)).rejects.toMatchObject({ code: "23514", constraint: rule });
  expect(await database.db(table).where(where).first()).toEqual(before);
});
