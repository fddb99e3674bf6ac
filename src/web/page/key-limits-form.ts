import { create } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { KeyLimitsSchema, type ApiKey, type KeyLimits } from "../../gen/typesafe/account/v1/account_service_pb.js";
import { byId, formatCredits, formatUtc } from "./dom.js";

/**
 * The limits fields of a key (the create form's and the edit dialog's, told
 * apart by the start of their ids, the form's name): read into a KeyLimits message, filled from one.
 * The service checks every rule and names the field it refuses.
 */
export function readLimits(form: string): KeyLimits {
  const scopes = ["decisions", "search"].filter((scope) => byId(`${form}-scope-${scope}`, HTMLInputElement).checked);
  const budget = byId(`${form}-budget`, HTMLInputElement).value.trim();
  const rate = byId(`${form}-rate`, HTMLInputElement).value.trim();
  const expires = byId(`${form}-expires`, HTMLInputElement).value;
  return create(KeyLimitsSchema, {
    // Both boxes ticked is the default, sent as none; neither ticked is sent as is, and refused.
    scopes: scopes.length === 2 ? [] : scopes.length === 0 ? ["none"] : scopes,
    budgetCredits: budget === "" ? undefined : Number(budget),
    budgetPeriod: budget === "" ? "" : byId(`${form}-period`, HTMLSelectElement).value,
    requestsPerMinute: rate === "" ? 0 : Number(rate),
    // datetime-local is the reader's local time; Date reads it so.
    expiresAt: expires === "" ? undefined : timestampFromDate(new Date(expires)),
  });
}

export function fillLimits(form: string, limits: KeyLimits | undefined): void {
  const scopes = limits?.scopes.length ? limits.scopes : ["decisions", "search"];
  for (const scope of ["decisions", "search"]) byId(`${form}-scope-${scope}`, HTMLInputElement).checked = scopes.includes(scope);
  byId(`${form}-budget`, HTMLInputElement).value = limits?.budgetCredits === undefined ? "" : String(limits.budgetCredits);
  byId(`${form}-period`, HTMLSelectElement).value = limits?.budgetPeriod || "day";
  byId(`${form}-rate`, HTMLInputElement).value = limits?.requestsPerMinute ? String(limits.requestsPerMinute) : "";
  const expires = limits?.expiresAt ? timestampDate(limits.expiresAt) : undefined;
  byId(`${form}-expires`, HTMLInputElement).value = expires ? new Date(expires.getTime() - expires.getTimezoneOffset() * 60_000).toISOString().slice(0, 16) : "";
}

const PERIODS: Record<string, string> = { day: "a day", week: "a week", month: "a month", total: "in total" };

/** "decisions only · 1 credit a day · 10 a minute · expires 2026-11-27 10:00 UTC", or "none". */
export function describeLimits(limits: KeyLimits | undefined): string {
  if (!limits) return "none";
  const parts: string[] = [];
  if (limits.scopes.length === 1) parts.push(`${limits.scopes[0]} only`);
  if (limits.budgetCredits !== undefined) parts.push(`${formatCredits(limits.budgetCredits)} credits ${PERIODS[limits.budgetPeriod] ?? limits.budgetPeriod}`);
  if (limits.requestsPerMinute > 0) parts.push(`${limits.requestsPerMinute} a minute`);
  if (limits.expiresAt) parts.push(`expires ${formatUtc(timestampDate(limits.expiresAt))}`);
  return parts.length > 0 ? parts.join(" · ") : "none";
}

/** "0.0001 spent, 0.0319 left (0 held)", or "no budget". */
export function describeBudget(key: ApiKey): string {
  const usage = key.budgetUsage;
  if (!usage) return "no budget";
  const held = usage.heldCredits > 0 ? `, ${formatCredits(usage.heldCredits)} held` : "";
  return `${formatCredits(usage.spentCredits)} spent, ${formatCredits(usage.leftCredits)} left${held}`;
}
