import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { CreateKeyRequestSchema, InviteMemberRequestSchema, SetAlertsRequestSchema } from "../../src/gen/typesafe/account/v1/account_service_pb.js";
import { STORABLE_TEXT_RULE, storableTextViolations } from "../../src/validation.js";

/** The one text rule of the account area's requests, walked over a decoded message: every string field, nested and listed. */
describe("storableTextViolations", () => {
  it.each([
    ["a plain email", "ada@example.com", []],
    ["an emoji", "🙂@example.com", []],
    ["U+0000 inside", "a\u0000b@example.com", ["email"]],
    ["U+0000 alone", "\u0000", ["email"]],
    ["a lone high surrogate", "a\ud800@example.com", ["email"]],
    ["a lone low surrogate", "\udc00", ["email"]],
    ["another control character (other rules judge it)", "a\u0007@example.com", []],
  ])("an invite's email, %s: %j", (_what, email, fields) => {
    const violations = storableTextViolations(InviteMemberRequestSchema, create(InviteMemberRequestSchema, { email }));
    expect(violations).toEqual(fields.map((field) => ({ field, rule: STORABLE_TEXT_RULE })));
  });

  it("names nested and listed fields by their JSON path, every one that breaks the rule", () => {
    const message = create(CreateKeyRequestSchema, { name: "k\u0000", limits: { scopes: ["decisions", "x\u0000"], budgetPeriod: "\udc00" } });
    expect(storableTextViolations(CreateKeyRequestSchema, message).map((v) => v.field)).toEqual(["name", "limits.scopes[1]", "limits.budget_period"]);
  });

  it("a message without text, or with none set, has nothing to say", () => {
    expect(storableTextViolations(SetAlertsRequestSchema, create(SetAlertsRequestSchema, { thresholdsCredits: [1, 2] }))).toEqual([]);
    expect(storableTextViolations(CreateKeyRequestSchema, create(CreateKeyRequestSchema))).toEqual([]);
  });
});
