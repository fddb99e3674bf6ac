import type { HandlerContext } from "@connectrpc/connect";
import { actionRefusal, type Action } from "../team/roles.js";
import type { SessionMember } from "../sign-in/sessions.js";
import { apiError } from "../errors.js";
import { memberOf } from "./door.js";

/** What a member whose account requires a second factor may still do before enrolling one. */
export const TWO_FACTOR_RULE = "the account requires two-factor sign-in: enroll a second factor first";

/**
 * The member a call acts for, once the member may do what it asks: the
 * account's two-factor rule, then their role. Every AccountService method
 * that reads or changes the account passes here, whatever the surface
 * (Connect, gRPC, the JSON paths, the CSV), so each refusal is the same
 * typed 403 naming its rule.
 */
export function allowed(ctx: HandlerContext, action: Action): SessionMember {
  return allowedMember(memberOf(ctx), action);
}

/** As `allowed`, for a member already resumed (the CSV download). */
export function allowedMember(member: SessionMember, action: Action): SessionMember {
  if (member.twoFactorRequired && !member.twoFactorEnabled) {
    throw apiError("TWO_FACTOR_REQUIRED", TWO_FACTOR_RULE, { rule: TWO_FACTOR_RULE });
  }
  const rule = actionRefusal(member.role, action);
  if (rule) {
    throw apiError("ROLE_FORBIDDEN", `${rule} (your role: ${member.role})`, { rule, metadata: { role: member.role, action } });
  }
  return member;
}
