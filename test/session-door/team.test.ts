import { Code } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROLES, type Role } from "../../src/team/roles.js";
import { AccountService } from "../../src/gen/typesafe/account/v1/account_service_pb.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { accountClient, inviteMember, refusal, startAccountApp, uniqueEmail, type AccountClient, type AccountTestApp } from "./support.js";

/**
 * Roles in the account area: what each role may do, the owner role kept in
 * owners' hands, the last owner kept, every change in the activity list with
 * who made it, and another account's members out of reach. The rules live in
 * the AccountService; the surfaces test shows each reaches Connect, gRPC and
 * the JSON paths alike.
 */
let database: TestDatabase;
let service: AccountTestApp;
const PASSWORD = "a long enough password";

beforeAll(async () => {
  database = await createTestDatabase(10, { countsDeliveries: true });
  // Endpoints on loopback, where nothing listens: the role checks are what is tested here.
  service = await startAccountApp(database, { TYPESAFE_WEBHOOK_ALLOW_LOOPBACK: "on" });
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

interface Seat {
  memberId: string;
  email: string;
  client: AccountClient;
}

/** A fresh account with one signed-in member of each role, and a spare member of each role to act on. */
async function team(protocol: "connect" | "grpc" = "connect") {
  const { accountId } = await createTestAccount(database.db, { units: 1_000_000 });
  const seat = async (role: Role, signIn: boolean): Promise<Seat> => {
    const email = uniqueEmail(role);
    const { memberId, token } = await inviteMember(database.db, accountId, email, service.clock.now(), role);
    const { client } = accountClient(service.url, { protocol });
    if (signIn) await client.acceptInvite({ inviteToken: token, password: PASSWORD });
    return { memberId, email, client };
  };
  const actors = {} as Record<Role, Seat>;
  const targets = {} as Record<Role, Seat>;
  for (const role of ROLES) actors[role] = await seat(role, true);
  for (const role of ROLES) targets[role] = await seat(role, false);
  return { accountId, actors, targets };
}

type Team = Awaited<ReturnType<typeof team>>;

/** Each action of the account area, as a call an actor makes on a fresh team. */
const ACTIONS: Record<string, (client: AccountClient, t: Team) => Promise<unknown>> = {
  getAccount: (c) => c.getAccount({}),
  listKeys: (c) => c.listKeys({}),
  listUsage: (c) => c.listUsage({}),
  getUsageSummary: (c) => c.getUsageSummary({}),
  listActivity: (c) => c.listActivity({}),
  listMembers: (c) => c.listMembers({}),
  createKey: (c) => c.createKey({ name: "k" }),
  revokeKey: async (c, t) => {
    const { key } = await t.actors.owner.client.createKey({ name: "to revoke" });
    return c.revokeKey({ keyId: key!.id });
  },
  inviteMember: (c) => c.inviteMember({ email: uniqueEmail("new"), role: "member" }),
  removeMember: (c, t) => c.removeMember({ memberId: t.targets.member.memberId }),
  setMemberRole: (c, t) => c.setMemberRole({ memberId: t.targets.member.memberId, role: "viewer" }),
  setTwoFactorRequired: (c) => c.setTwoFactorRequired({ required: false }),
  updateKey: async (c, t) => {
    const { key } = await t.actors.owner.client.createKey({ name: "to limit" });
    return c.updateKey({ keyId: key!.id, limits: { scopes: ["decisions"] } });
  },
  rollKey: async (c, t) => {
    const { key } = await t.actors.owner.client.createKey({ name: "to roll" });
    return c.rollKey({ keyId: key!.id, oldKeyExpiresInSeconds: 0 });
  },
  getAlerts: (c) => c.getAlerts({}),
  setAlerts: (c) => c.setAlerts({ thresholdsCredits: [1] }),
  listWebhookEndpoints: (c) => c.listWebhookEndpoints({}),
  listWebhookDeliveries: (c) => c.listWebhookDeliveries({}),
  addWebhookEndpoint: (c) => c.addWebhookEndpoint({ url: NOWHERE }),
  removeWebhookEndpoint: async (c, t) => c.removeWebhookEndpoint({ endpointId: await ownersEndpoint(t) }),
  rotateWebhookSecret: async (c, t) => c.rotateWebhookSecret({ endpointId: await ownersEndpoint(t) }),
  enableWebhookEndpoint: async (c, t) => c.enableWebhookEndpoint({ endpointId: await ownersEndpoint(t) }),
  sendTestWebhook: async (c, t) => c.sendTestWebhook({ endpointId: await ownersEndpoint(t) }),
  createEvaluation: (c) => c.createEvaluation(SMALL_EVALUATION),
  listEvaluations: (c) => c.listEvaluations({}),
  getEvaluation: async (c, t) => c.getEvaluation({ evaluationId: await ownersEvaluation(t) }),
  getEvaluationResults: async (c, t) => c.getEvaluationResults({ evaluationId: await ownersEvaluation(t) }),
  cancelEvaluation: async (c, t) => c.cancelEvaluation({ evaluationId: await ownersEvaluation(t) }),
  deleteEvaluation: async (c, t) => c.deleteEvaluation({ evaluationId: await ownersEvaluation(t, true) }),
  // A running evaluation cannot be resumed: an allowed role gets past the role check to EVALUATION_STATE.
  resumeEvaluation: async (c, t) => {
    const evaluationId = await ownersEvaluation(t);
    return c.resumeEvaluation({ evaluationId }).catch(async (err: unknown) => {
      const refused = await refusal(Promise.reject(err));
      if (refused.reason === "EVALUATION_STATE") return "past the role check";
      throw err;
    });
  },
  // A running evaluation cannot be fitted: an allowed role gets past the role check to EVALUATION_STATE.
  fitCalibration: async (c, t) => {
    const evaluationId = await ownersEvaluation(t);
    return c.fitCalibration({ evaluationId, questionKey: "urgent", method: "platt" }).catch(async (err: unknown) => {
      const refused = await refusal(Promise.reject(err));
      if (refused.reason === "EVALUATION_STATE") return "past the role check";
      throw err;
    });
  },
  listCalibrations: (c) => c.listCalibrations({}),
  // No calibration yet: every role gets past the role check to NOT_FOUND.
  getCalibration: (c) =>
    c.getCalibration({ calibrationId: crypto.randomUUID() }).catch(async (err: unknown) => {
      const refused = await refusal(Promise.reject(err));
      if (refused.reason === "NOT_FOUND") return "past the role check";
      throw err;
    }),
  // No finished delivery to replay: an allowed role gets past the role check to NOT_FOUND.
  replayWebhookDelivery: (c) =>
    c.replayWebhookDelivery({ deliveryId: "1" }).catch(async (err: unknown) => {
      const refused = await refusal(Promise.reject(err));
      if (refused.reason === "NOT_FOUND") return "past the role check";
      throw err;
    }),
};

/** An owner's evaluation, cancelled when asked (so that it may be deleted); nothing runs it here (no upstream). */
async function ownersEvaluation(t: Team, cancelled = false): Promise<string> {
  const { evaluation } = await t.actors.owner.client.createEvaluation(SMALL_EVALUATION);
  if (cancelled) await t.actors.owner.client.cancelEvaluation({ evaluationId: evaluation!.id });
  return evaluation!.id;
}

const SMALL_EVALUATION = {
  questions: { urgent: { type: "noul", instructions: "Is it urgent?" } },
  examples: [{ state: { kind: { case: "stringValue" as const, value: "the site is down" } }, labels: { urgent: { kind: { case: "boolValue" as const, value: true } } } }],
  creditCapCredits: 1,
};

/** A loopback address where nothing listens (the discard port). */
const NOWHERE = "http://127.0.0.1:9/hook";

async function ownersEndpoint(t: Team): Promise<string> {
  const { endpoint } = await t.actors.owner.client.addWebhookEndpoint({ url: NOWHERE });
  return endpoint!.id;
}

/** Who may do what: the documented table (docs/account-area.md). */
const ALLOWED: Record<string, readonly Role[]> = {
  getAccount: ROLES,
  listKeys: ROLES,
  listUsage: ROLES,
  getUsageSummary: ROLES,
  listActivity: ROLES,
  listMembers: ROLES,
  createKey: ["owner", "admin", "member"],
  revokeKey: ["owner", "admin", "member"],
  inviteMember: ["owner", "admin"],
  removeMember: ["owner", "admin"],
  setMemberRole: ["owner", "admin"],
  setTwoFactorRequired: ["owner"],
  updateKey: ["owner", "admin", "member"],
  rollKey: ["owner", "admin", "member"],
  getAlerts: ROLES,
  setAlerts: ["owner", "admin"],
  listWebhookEndpoints: ROLES,
  listWebhookDeliveries: ROLES,
  addWebhookEndpoint: ["owner", "admin"],
  removeWebhookEndpoint: ["owner", "admin"],
  rotateWebhookSecret: ["owner", "admin"],
  enableWebhookEndpoint: ["owner", "admin"],
  sendTestWebhook: ["owner", "admin"],
  replayWebhookDelivery: ["owner", "admin"],
  createEvaluation: ["owner", "admin", "member"],
  listEvaluations: ROLES,
  getEvaluation: ROLES,
  getEvaluationResults: ROLES,
  cancelEvaluation: ["owner", "admin", "member"],
  resumeEvaluation: ["owner", "admin", "member"],
  deleteEvaluation: ["owner", "admin", "member"],
  fitCalibration: ["owner", "admin", "member"],
  getCalibration: ROLES,
  listCalibrations: ROLES,
};

/** The methods outside the matrix, and why: how a session starts or ends, and a member's own second factor. */
const OUTSIDE_THE_MATRIX = [
  "acceptInvite",
  "signIn",
  "signInSecondStep",
  "signOut",
  "startTwoFactorEnrollment",
  "confirmTwoFactorEnrollment",
  "disableTwoFactor",
];

it("every AccountService method is in the matrix or named outside it: a new one must say which roles may call it", () => {
  expect(Object.keys(AccountService.method).sort()).toEqual([...Object.keys(ACTIONS), ...OUTSIDE_THE_MATRIX].sort());
});

/** The action each method refused to some role asks for, as its refusal's metadata names it. */
const ASKS_FOR: Record<string, string> = {
  createKey: "manage_keys",
  revokeKey: "manage_keys",
  updateKey: "manage_keys",
  rollKey: "manage_keys",
  inviteMember: "manage_members",
  removeMember: "manage_members",
  setMemberRole: "manage_members",
  setTwoFactorRequired: "require_two_factor",
  setAlerts: "manage_alerts",
  addWebhookEndpoint: "manage_alerts",
  removeWebhookEndpoint: "manage_alerts",
  rotateWebhookSecret: "manage_alerts",
  enableWebhookEndpoint: "manage_alerts",
  sendTestWebhook: "manage_alerts",
  replayWebhookDelivery: "manage_alerts",
  createEvaluation: "run_evaluations",
  cancelEvaluation: "run_evaluations",
  resumeEvaluation: "run_evaluations",
  deleteEvaluation: "run_evaluations",
  fitCalibration: "run_evaluations",
};

/** The rule each action's refusal names (docs/account-area.md). */
const RULE_OF: Record<string, string> = {
  manage_keys: "owners, admins and members manage keys; viewers only read",
  manage_members: "owners and admins invite, remove and change the roles of members",
  manage_alerts: "owners and admins set balance alerts and webhook endpoints",
  require_two_factor: "only owners require two-factor sign-in for the account",
  run_evaluations: "owners, admins and members create, cancel, resume and delete evaluations and fit calibrations (they spend the account's credits, as keys do); viewers only read",
};

const MATRIX = Object.keys(ACTIONS).flatMap((action) => ROLES.map((role) => [action, role, ALLOWED[action]!.includes(role)] as const));

describe("each role × each action", () => {
  it.each(MATRIX)("%s by a %s: allowed %s", async (action, role, allowed) => {
    const t = await team();
    const call = ACTIONS[action]!(t.actors[role].client, t);
    if (allowed) {
      await expect(call).resolves.toBeDefined();
      return;
    }
    const refused = await refusal(call);
    expect([refused.code, refused.reason]).toEqual([Code.PermissionDenied, "ROLE_FORBIDDEN"]);
    const asked = ASKS_FOR[action]!;
    expect(refused.rule).toBe(RULE_OF[asked]);
    expect(refused.message).toBe(`${RULE_OF[asked]} (your role: ${role})`);
    expect(refused.detailMetadata).toEqual({ role, action: asked });
  });
});

describe("the owner role stays in owners' hands", () => {
  it.each([
    ["invite an owner", (t: Team) => t.actors.admin.client.inviteMember({ email: uniqueEmail("boss"), role: "owner" })],
    ["promote to owner", (t: Team) => t.actors.admin.client.setMemberRole({ memberId: t.targets.member.memberId, role: "owner" })],
    ["demote an owner", (t: Team) => t.actors.admin.client.setMemberRole({ memberId: t.targets.owner.memberId, role: "member" })],
    ["remove an owner", (t: Team) => t.actors.admin.client.removeMember({ memberId: t.targets.owner.memberId })],
  ])("an admin may not %s", async (_name, act) => {
    const t = await team();
    const refused = await refusal(act(t));
    expect([refused.reason, refused.rule]).toEqual(["ROLE_FORBIDDEN", "only owners grant, change or remove the owner role"]);
    const roles = await database.db("members").where({ account_id: t.accountId }).whereNull("removed_at").pluck("role");
    expect(roles.filter((r) => r === "owner")).toHaveLength(2);
  });

  it("an owner may do each of those", async () => {
    const t = await team();
    const owner = t.actors.owner.client;
    expect((await owner.inviteMember({ email: uniqueEmail("boss"), role: "owner" })).member?.role).toBe("owner");
    expect((await owner.setMemberRole({ memberId: t.targets.member.memberId, role: "owner" })).member?.role).toBe("owner");
    expect((await owner.setMemberRole({ memberId: t.targets.owner.memberId, role: "member" })).member?.role).toBe("member");
    await owner.removeMember({ memberId: t.targets.admin.memberId });
  });

  it("an admin's own demotion by an admin, and a new role, hold from the next call", async () => {
    const t = await team();
    await t.actors.owner.client.setMemberRole({ memberId: t.actors.admin.memberId, role: "viewer" });
    const refused = await refusal(t.actors.admin.client.createKey({}));
    expect(refused.reason).toBe("ROLE_FORBIDDEN");
  });
});

describe("the last owner", () => {
  /** An account whose only owner is signed in, with an admin. */
  async function soleOwner() {
    const { accountId } = await createTestAccount(database.db);
    const join = async (role: Role) => {
      const email = uniqueEmail(role);
      const { memberId, token } = await inviteMember(database.db, accountId, email, service.clock.now(), role);
      const { client } = accountClient(service.url);
      await client.acceptInvite({ inviteToken: token, password: PASSWORD });
      return { memberId, client };
    };
    return { accountId, owner: await join("owner"), admin: await join("admin") };
  }

  it.each(["admin", "member", "viewer"] as const)("cannot demote themself to %s", async (role) => {
    const { owner } = await soleOwner();
    const refused = await refusal(owner.client.setMemberRole({ memberId: owner.memberId, role }));
    expect([refused.code, refused.reason, refused.field]).toEqual([Code.PermissionDenied, "LAST_OWNER", "member_id"]);
    expect((await owner.client.getAccount({})).member?.role).toBe("owner");
  });

  it("cannot be removed, by themself or anyone", async () => {
    const { owner } = await soleOwner();
    expect((await refusal(owner.client.removeMember({ memberId: owner.memberId }))).reason).toBe("LAST_OWNER");
    await owner.client.getAccount({});
  });

  it("can leave once another owner is there, and the other cannot then leave", async () => {
    const { owner, admin } = await soleOwner();
    await owner.client.setMemberRole({ memberId: admin.memberId, role: "owner" });
    await owner.client.setMemberRole({ memberId: owner.memberId, role: "member" });
    expect((await refusal(admin.client.setMemberRole({ memberId: admin.memberId, role: "member" }))).reason).toBe("LAST_OWNER");
  });

  it("two owners demoting each other at once leave one owner", async () => {
    const { owner, admin } = await soleOwner();
    await owner.client.setMemberRole({ memberId: admin.memberId, role: "owner" });
    const results = await Promise.allSettled([
      owner.client.setMemberRole({ memberId: admin.memberId, role: "member" }),
      admin.client.setMemberRole({ memberId: owner.memberId, role: "member" }),
    ]);
    expect(results.filter((r) => r.status === "fulfilled")).toHaveLength(1);
    const owners = await database.db("members").where({ role: "owner" }).whereIn("id", [owner.memberId, admin.memberId]).count<{ count: string }[]>({ count: "*" });
    expect(Number(owners[0]!.count)).toBe(1);
  });
});

describe("the team, from the page's calls", () => {
  it("an invite from an owner is shown once as a link that works once, within 24 hours, with the role given", async () => {
    const t = await team();
    const email = uniqueEmail("Invited");
    const invited = await t.actors.admin.client.inviteMember({ email, role: "viewer" });
    expect(invited.member).toMatchObject({ email: email.toLowerCase(), role: "viewer", inviteAccepted: false, twoFactorEnabled: false });
    const token = new URL(invited.inviteUrl).searchParams.get("invite")!;
    // The link starts with the public URL (here the default, http://HOST:PORT with the configured port 0).
    expect(invited.inviteUrl).toBe(`http://127.0.0.1:0/account/?invite=${token}`);
    const expiresMs = Number(invited.expiresAt!.seconds) * 1000 + Math.floor(invited.expiresAt!.nanos / 1e6) - service.clock.now().getTime();
    expect(expiresMs).toBe(24 * 3_600_000);

    const { client } = accountClient(service.url);
    const accepted = await client.acceptInvite({ inviteToken: token, password: PASSWORD });
    expect(accepted.member).toMatchObject({ role: "viewer", accountId: t.accountId });
    expect((await refusal(accountClient(service.url).client.acceptInvite({ inviteToken: token, password: PASSWORD }))).reason).toBe("INVITE_INVALID");
    expect((await refusal(client.createKey({}))).reason).toBe("ROLE_FORBIDDEN");
  });

  it("refuses to invite a member who accepted (no password resets by members) and a bad role or email, naming the field", async () => {
    const t = await team();
    const again = await refusal(t.actors.owner.client.inviteMember({ email: t.actors.member.email, role: "member" }));
    expect([again.reason, again.field]).toEqual(["INVALID_ARGUMENT", "email"]);
    expect([(await refusal(t.actors.owner.client.inviteMember({ email: uniqueEmail("x"), role: "king" }))).field]).toEqual(["role"]);
    expect([(await refusal(t.actors.owner.client.inviteMember({ email: "no at sign", role: "member" }))).field]).toEqual(["email"]);
    expect((await refusal(t.actors.owner.client.setMemberRole({ memberId: t.targets.member.memberId, role: "" }))).field).toBe("role");
  });

  it("a removed member's session ends at once and their invite stops working", async () => {
    const t = await team();
    const removed = await t.actors.admin.client.removeMember({ memberId: t.actors.member.memberId });
    expect(removed.sessionsEnded).toBe(1);
    expect((await refusal(t.actors.member.client.getAccount({}))).reason).toBe("SIGNED_OUT");
    const listed = await t.actors.owner.client.listMembers({});
    expect(listed.members.map((m) => m.id)).not.toContain(t.actors.member.memberId);
  });

  it("every change is in the activity list with who made it", async () => {
    const t = await team();
    const email = uniqueEmail("logged");
    await t.actors.admin.client.inviteMember({ email, role: "member" });
    await t.actors.owner.client.setMemberRole({ memberId: t.targets.viewer.memberId, role: "member" });
    await t.actors.admin.client.removeMember({ memberId: t.targets.member.memberId });
    const { events } = await t.actors.viewer.client.listActivity({ pageSize: 3 });
    expect(events.map((e) => [e.kind, e.actor, e.detail])).toEqual([
      ["member_removed", t.actors.admin.email, t.targets.member.email],
      ["member_role_changed", t.actors.owner.email, `${t.targets.viewer.email}: viewer to member`],
      ["member_invited", t.actors.admin.email, `${email.toLowerCase()} as member`],
    ]);
  });

  it("a member of another account is NOT_FOUND, exactly as a missing one, and stays as it was", async () => {
    const mine = await team();
    const theirs = await team();
    const missing = await refusal(mine.actors.owner.client.removeMember({ memberId: "00000000-0000-0000-0000-000000000000" }));
    for (const call of [
      () => mine.actors.owner.client.removeMember({ memberId: theirs.actors.member.memberId }),
      () => mine.actors.owner.client.setMemberRole({ memberId: theirs.actors.member.memberId, role: "owner" }),
    ]) {
      const refused = await refusal(call());
      expect([refused.reason, refused.field, refused.message]).toEqual(["NOT_FOUND", missing.field, missing.message]);
    }
    expect((await refusal(mine.actors.owner.client.removeMember({ memberId: "not-a-uuid" }))).reason).toBe("NOT_FOUND");
    const theirMember = await database.db("members").where({ id: theirs.actors.member.memberId }).first();
    expect([theirMember.role, theirMember.removed_at]).toEqual(["member", null]);
    expect((await mine.actors.owner.client.listMembers({})).members.every((m) => m.accountId === mine.accountId)).toBe(true);
    await theirs.actors.member.client.getAccount({});
  });

  it("an invite for an email of another account is refused with the same answer as one of this account", async () => {
    const mine = await team();
    const theirs = await team();
    const here = await refusal(mine.actors.owner.client.inviteMember({ email: mine.actors.member.email, role: "member" }));
    const there = await refusal(mine.actors.owner.client.inviteMember({ email: theirs.actors.member.email, role: "member" }));
    expect([there.reason, there.field, there.message]).toEqual([here.reason, here.field, here.message]);
  });
});

describe("the same rule on gRPC and the JSON paths", () => {
  it("a viewer's CreateKey over gRPC is PERMISSION_DENIED with ROLE_FORBIDDEN", async () => {
    const t = await team("grpc");
    const refused = await refusal(t.actors.viewer.client.createKey({}));
    expect([refused.code, refused.reason]).toEqual([Code.PermissionDenied, "ROLE_FORBIDDEN"]);
  });

  it("a member's POST /account/v1/members/invite is 403 ROLE_FORBIDDEN in the envelope, and the last owner's removal 403 LAST_OWNER", async () => {
    const { accountId } = await createTestAccount(database.db);
    const cookieOf = async (role: Role) => {
      const { token, memberId } = await inviteMember(database.db, accountId, uniqueEmail(role), service.clock.now(), role);
      const answer = await fetch(`${service.url}/account/v1/invites/accept`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ invite_token: token, password: PASSWORD }),
      });
      return { cookie: answer.headers.getSetCookie()[0]!.split(";")[0]!, memberId };
    };
    const member = await cookieOf("member");
    const owner = await cookieOf("owner");
    const post = async (path: string, cookie: string, body: unknown) => {
      const answer = await fetch(`${service.url}${path}`, { method: "POST", headers: { "content-type": "application/json", cookie }, body: JSON.stringify(body) });
      return { status: answer.status, body: (await answer.json()) as { code: number; data: Record<string, unknown> } };
    };
    const invited = await post("/account/v1/members/invite", member.cookie, { email: uniqueEmail("x"), role: "member" });
    expect([invited.status, invited.body.code, invited.body.data["reason"], invited.body.data["rule"], invited.body.data["metadata"]]).toEqual([
      403,
      40303,
      "ROLE_FORBIDDEN",
      "owners and admins invite, remove and change the roles of members",
      { role: "member", action: "manage_members" },
    ]);
    const last = await post("/account/v1/members/remove", owner.cookie, { member_id: owner.memberId });
    expect([last.status, last.body.code, last.body.data["reason"]]).toEqual([403, 40304, "LAST_OWNER"]);
  });
});
