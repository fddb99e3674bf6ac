/**
 * A member's role decides what they may do in the account area. Owners do
 * everything; admins run the team (invite, remove, change roles) and keys;
 * members manage keys and run evaluations; viewers only read. Owners and admins set balance
 * alerts and webhook endpoints. One table, read by the account
 * area and the operator CLI alike.
 */
export const ROLES = ["owner", "admin", "member", "viewer"] as const;
export type Role = (typeof ROLES)[number];

/** What a call of the account area asks to do. */
export type Action = "read" | "manage_keys" | "manage_members" | "manage_alerts" | "require_two_factor" | "run_evaluations";

/** The roles allowed each action. */
export const ALLOWED_ROLES: Readonly<Record<Action, readonly Role[]>> = {
  read: ["owner", "admin", "member", "viewer"],
  manage_keys: ["owner", "admin", "member"],
  manage_members: ["owner", "admin"],
  manage_alerts: ["owner", "admin"],
  require_two_factor: ["owner"],
  run_evaluations: ["owner", "admin", "member"],
};

/** Each action's rule, as a refusal names it. */
export const ACTION_RULES: Readonly<Record<Action, string>> = {
  read: "every member reads the account",
  manage_keys: "owners, admins and members manage keys; viewers only read",
  manage_members: "owners and admins invite, remove and change the roles of members",
  manage_alerts: "owners and admins set balance alerts and webhook endpoints",
  require_two_factor: "only owners require two-factor sign-in for the account",
  run_evaluations: "owners, admins and members create, cancel, resume and delete evaluations and fit calibrations (they spend the account's credits, as keys do); viewers only read",
};

/** The rule that keeps the owner role in owners' hands. */
export const OWNER_ROLE_RULE = "only owners grant, change or remove the owner role";

export function isRole(text: string): text is Role {
  return (ROLES as readonly string[]).includes(text);
}

/** Which rule refuses this role the action, or undefined when it is allowed. */
export function actionRefusal(role: Role, action: Action): string | undefined {
  return ALLOWED_ROLES[action].includes(role) ? undefined : ACTION_RULES[action];
}

/**
 * Which rule refuses an actor a change to a member: inviting with a role
 * (`from` undefined), changing a role, or removing (`to` undefined). The last
 * owner's rule needs the account's other members, so the store checks it.
 */
export function memberChangeRefusal(actor: Role, change: { from?: Role; to?: Role }): string | undefined {
  const refused = actionRefusal(actor, "manage_members");
  if (refused) return refused;
  if (actor !== "owner" && (change.from === "owner" || change.to === "owner")) return OWNER_ROLE_RULE;
  return undefined;
}
