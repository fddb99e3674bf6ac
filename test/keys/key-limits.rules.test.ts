import { describe, expect, it } from "vitest";
import { keyLimitsOf, parseKeyLimits, periodEnd, type KeyLimitsInput } from "../../src/keys/key-limits.js";
import type { KeyLimitsRow } from "../../src/keys/store.js";

/** A key's limits as pure rules: what a request may set, how a row reads back, where a budget period ends. */

const now = new Date("2031-03-05T12:00:00.000Z");
const context = { now, accountRateLimit: 60, fieldPath: "limits" };
const input = (init: Partial<KeyLimitsInput> = {}): KeyLimitsInput => ({ scopes: [], budgetPeriod: "", rateLimit: 0, ...init });

describe("parseKeyLimits", () => {
  it("with nothing set: no expiry, both scopes, no budget, the account's rate", () => {
    expect(parseKeyLimits(input(), context)).toEqual({
      limits: { expiresAt: null, scopes: ["decisions", "search"], budget: null, rateLimit: null },
      violations: [],
    });
  });

  it("with everything set: the expiry, the scopes once each, the budget in units, the rate", () => {
    const expiresAt = new Date(now.getTime() + 1);
    expect(parseKeyLimits(input({ expiresAt, scopes: ["search", "search"], budgetCredits: 1.5, budgetPeriod: "week", rateLimit: 60 }), context)).toEqual({
      limits: { expiresAt, scopes: ["search"], budget: { units: 1_500_000, period: "week" }, rateLimit: 60 },
      violations: [],
    });
  });

  it.each<[string, Partial<KeyLimitsInput>, { field: string; rule: string } | undefined]>([
    ["an expiry now", { expiresAt: now }, { field: "limits.expires_at", rule: "must be in the future" }],
    ["an expiry before now", { expiresAt: new Date(now.getTime() - 1) }, { field: "limits.expires_at", rule: "must be in the future" }],
    ["an expiry a millisecond ahead", { expiresAt: new Date(now.getTime() + 1) }, undefined],
    ["an unknown scope beside a known one", { scopes: ["decisions", "admin"] }, { field: "limits.scopes", rule: 'each one of "decisions", "search"; empty means both' }],
    ["an unknown scope alone", { scopes: ["admin"] }, { field: "limits.scopes", rule: 'each one of "decisions", "search"; empty means both' }],
    ["a budget of 0", { budgetCredits: 0, budgetPeriod: "day" }, undefined],
    ["a budget of one unit", { budgetCredits: 0.000001, budgetPeriod: "day" }, undefined],
    ["a budget whose product with a million is not exact in floating point", { budgetCredits: 1.001, budgetPeriod: "day" }, undefined],
    ["a budget finer than a unit", { budgetCredits: 0.0000015, budgetPeriod: "day" }, { field: "limits.budget_credits", rule: "a number of credits from 0, with at most 6 decimals" }],
    ["a large budget with 6 decimals", { budgetCredits: 123_456.000001, budgetPeriod: "total" }, undefined],
    ["a large budget with 7 decimals", { budgetCredits: 1_000.0000005, budgetPeriod: "total" }, { field: "limits.budget_credits", rule: "a number of credits from 0, with at most 6 decimals" }],
    ["a negative budget", { budgetCredits: -0.000001, budgetPeriod: "day" }, { field: "limits.budget_credits", rule: "a number of credits from 0, with at most 6 decimals" }],
    ["a budget past a safe integer of units", { budgetCredits: 1e10, budgetPeriod: "day" }, { field: "limits.budget_credits", rule: "a number of credits from 0, with at most 6 decimals" }],
    ["an infinite budget", { budgetCredits: Infinity, budgetPeriod: "day" }, { field: "limits.budget_credits", rule: "a number of credits from 0, with at most 6 decimals" }],
    ["the smallest double, 5e-324", { budgetCredits: 5e-324, budgetPeriod: "day" }, { field: "limits.budget_credits", rule: "a number of credits from 0, with at most 6 decimals" }],
    ["a budget of 1e-7, a seventh decimal written as an exponent", { budgetCredits: 1e-7, budgetPeriod: "day" }, { field: "limits.budget_credits", rule: "a number of credits from 0, with at most 6 decimals" }],
    ["a budget of 1e-19, far below a unit", { budgetCredits: 1e-19, budgetPeriod: "day" }, { field: "limits.budget_credits", rule: "a number of credits from 0, with at most 6 decimals" }],
    ["a budget of 1e21, written as an exponent", { budgetCredits: 1e21, budgetPeriod: "day" }, { field: "limits.budget_credits", rule: "a number of credits from 0, with at most 6 decimals" }],
    ["NaN", { budgetCredits: NaN, budgetPeriod: "day" }, { field: "limits.budget_credits", rule: "a number of credits from 0, with at most 6 decimals" }],
    ["a budget of a billion credits", { budgetCredits: 1e9, budgetPeriod: "total" }, undefined],
    ["a budget without a period", { budgetCredits: 1 }, { field: "limits.budget_period", rule: 'with a budget: "day", "week", "month" (UTC) or "total"' }],
    ["a budget with an unknown period", { budgetCredits: 1, budgetPeriod: "year" }, { field: "limits.budget_period", rule: 'with a budget: "day", "week", "month" (UTC) or "total"' }],
    ["a period without a budget", { budgetPeriod: "day" }, { field: "limits.budget_period", rule: "only with budget_credits" }],
    ["the account's rate", { rateLimit: 60 }, undefined],
    ["a rate above the account's", { rateLimit: 61 }, { field: "limits.requests_per_minute", rule: "from 1 to the account's 60, or 0 for the account's" }],
    ["a negative rate", { rateLimit: -1 }, { field: "limits.requests_per_minute", rule: "from 1 to the account's 60, or 0 for the account's" }],
    ["a fractional rate", { rateLimit: 1.5 }, { field: "limits.requests_per_minute", rule: "from 1 to the account's 60, or 0 for the account's" }],
  ])("%s", (_, init, violation) => {
    const parsed = parseKeyLimits(input(init), context);
    expect(parsed.violations).toEqual(violation ? [violation] : []);
  });

  it("reports every broken rule at once, under the caller's field path", () => {
    const parsed = parseKeyLimits(input({ expiresAt: now, scopes: ["x"], budgetPeriod: "day", rateLimit: 61 }), { ...context, fieldPath: "key.limits" });
    expect(parsed.violations.map((v) => v.field)).toEqual(["key.limits.expires_at", "key.limits.scopes", "key.limits.budget_period", "key.limits.requests_per_minute"]);
  });
});

describe("keyLimitsOf", () => {
  const row = (init: Partial<KeyLimitsRow>): KeyLimitsRow => ({
    expires_at: null,
    scopes: null,
    budget_units: null,
    budget_period: null,
    rate_limit: null,
    spent_units: 0,
    held_units: 0,
    period_start: null,
    ...init,
  });

  it.each<[string, Partial<KeyLimitsRow>, ReturnType<typeof keyLimitsOf>["budget"]]>([
    ["no budget", {}, null],
    ["units without a period", { budget_units: 5 }, null],
    ["a period without units", { budget_period: "day" }, null],
    ["a budget of 0 units", { budget_units: 0, budget_period: "total" }, { units: 0, period: "total" }],
    ["a budget read as a string (bigint)", { budget_units: "32000" as unknown as number, budget_period: "month" }, { units: 32_000, period: "month" }],
  ])("%s", (_, init, budget) => {
    expect(keyLimitsOf(row(init)).budget).toEqual(budget);
  });

  it("a NULL scope list is both scopes; a stored one is kept", () => {
    expect(keyLimitsOf(row({})).scopes).toEqual(["decisions", "search"]);
    expect(keyLimitsOf(row({ scopes: ["search"], rate_limit: 5, expires_at: now }))).toEqual({ expiresAt: now, scopes: ["search"], budget: null, rateLimit: 5 });
  });
});

describe("periodEnd", () => {
  it.each<[Parameters<typeof periodEnd>[0], string, string | null]>([
    ["day", "2031-03-05T00:00:00.000Z", "2031-03-06T00:00:00.000Z"],
    ["day", "2031-02-28T00:00:00.000Z", "2031-03-01T00:00:00.000Z"],
    ["week", "2031-03-03T00:00:00.000Z", "2031-03-10T00:00:00.000Z"],
    ["week", "2031-03-31T00:00:00.000Z", "2031-04-07T00:00:00.000Z"],
    ["month", "2031-03-01T00:00:00.000Z", "2031-04-01T00:00:00.000Z"],
    ["month", "2031-12-01T00:00:00.000Z", "2032-01-01T00:00:00.000Z"],
    ["total", "2031-03-01T00:00:00.000Z", null],
  ])("a %s from %s ends at %s", (period, start, end) => {
    expect(periodEnd(period, new Date(start))?.toISOString() ?? null).toBe(end);
  });
});
