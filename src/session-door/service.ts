import { create, type Message } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { Knex } from "knex";
import { listActivity, recordActivity, type DbActivityRow } from "../team/activity.js";
import { KEY_PREFIX } from "../keys/api-keys.js";
import { consumeInvite, findLiveInvite, inviteUrl } from "../team/invites.js";
import { emailProblem, findMember, findMemberByEmail, listMembers, MAX_EMAIL_CHARS, normalizeEmail, setPasswordHash, type DbMemberRow } from "../team/members.js";
import type { PasswordWork } from "../sign-in/password-work.js";
import { passwordStrengthProblem } from "../sign-in/password-strength.js";
import {
  createDummyHash,
  hashPassword,
  MAX_PASSWORD_CHARS,
  passwordLength,
  passwordProblem,
  SCRYPT_PARAMS,
  verifyPassword,
  type ScryptParams,
} from "../sign-in/passwords.js";
import { kRemoteAddress } from "../call/context.js";
import { endMemberSessions, endSession, startSession, type SessionMember, type SessionPolicy } from "../sign-in/sessions.js";
import { isRole, memberChangeRefusal, OWNER_ROLE_RULE, ROLES, type Role } from "../team/roles.js";
import { clearSignInAttempts, countSignInAttempt } from "../sign-in/sign-in-throttle.js";
import { MAX_KEY_NAME_CHARS, countLiveKeysLocked, createApiKey, findAccountKey, listAccountKeys, revokeAccountKey, type AccountKeyRow } from "../keys/store.js";
import { isUuid } from "../validation.js";
import {
  changeKeyLimits,
  keyLabel,
  keyLimitsOf,
  MAX_ROLL_GRACE_SECONDS,
  NO_KEY_LIMITS,
  parseKeyLimits,
  periodEnd,
  rollKey,
  setKeyLimits,
  type KeyLimits,
} from "../keys/key-limits.js";
import { changeMemberRole, findTeamMember, LAST_OWNER_RULE, removeTeamMember, inviteTeamMember } from "../team/team.js";
import {
  confirmTotpEnrollment,
  consumeSignInChallenge,
  createSignInChallenge,
  disableTotp,
  findSignInChallenge,
  newTotpSecret,
  setTwoFactorRequired,
  startTotpEnrollment,
  totpUri,
  useRecoveryCode,
  useTotpCode,
} from "../sign-in/two-factor.js";
import { apiError } from "../errors.js";
import {
  AccountService,
  type ApiKey,
  type KeyLimits as KeyLimitsMessage,
  type Member,
  ApiKeySchema,
  MemberSchema,
} from "../gen/typesafe/account/v1/account_service_pb.js";
import { listFinishedCalls, MAX_SUMMARY_DAYS, readAccountMoney, summarizeCalls } from "../metering/account-views.js";
import type { Metrics } from "../metrics.js";
import { unitsToCredits } from "../units.js";
import { storableTextViolations, throwIfInvalid } from "../validation.js";
import { clearSessionCookie, setSessionCookie, type SessionCookie } from "./cookie.js";
import { allowed } from "./access.js";
import { kSessionToken, memberOf } from "./door.js";
import { activityCursor, callCursor, checkedTime, encodePageToken, keyCursor, pageSize, usageFilter } from "../metering/usage-query.js";
import { DECISION_RESERVE_UNITS_PER_QUESTION } from "../metering/meter.js";
import { listDeliveries, replayDelivery, sendTestEvent, type DeliveryView } from "../webhooks/deliveries.js";
import { addEndpoint, enableEndpoint, findEndpoint, listEndpoints, MAX_ENDPOINTS, removeEndpoint, rotateSecret, type WebhookEndpointView } from "../webhooks/endpoints.js";
import { endpointUrlViolations } from "../webhooks/endpoint-url.js";
import { readAlertSettings, setAlertSettings, type AlertSettings } from "../webhooks/events.js";
import { thresholdViolations } from "../webhooks/thresholds.js";
import { createEvaluationMethods } from "./evaluations.js";

const DAY_MS = 86_400_000;

export interface AccountServiceDeps {
  db: Knex;
  cookie: SessionCookie;
  policy: SessionPolicy;
  now: () => Date;
  metrics?: Pick<Metrics, "recordSignIn">;
  /** The cost of new password hashes (tests lower it; stored hashes keep their own). */
  scryptParams?: ScryptParams;
  /** Where people reach the service: invite links start with it. */
  publicUrl: string;
  /** The one queue every password hash and check waits in. */
  passwordWork: PasswordWork;
  /** Live keys one account may have. */
  maxKeysPerAccount: number;
  /** Whether endpoints may be on loopback (development only), and a nudge to the deliverer when something is due now. */
  webhooks: { allowLoopback: boolean; wake: () => void };
  /** Tells this replica's evaluation runner that there is work now. */
  wakeEvaluationRunner?: () => void;
}

/**
 * The account area's service: a member of an account signs in and reads and
 * changes that account only. The door (door.ts) has checked the call's origin
 * and session before any of these run; every query below is filtered by the
 * signed-in member's account in SQL, so an id of another account is answered
 * exactly as an id that does not exist.
 */
export function createAccountService(deps: AccountServiceDeps): ServiceImpl<typeof AccountService> {
  const { db, cookie, policy, now } = deps;
  const scryptParams = deps.scryptParams ?? SCRYPT_PARAMS;
  const { passwordWork } = deps;
  // Made once, up front: every sign-in of an unknown email checks against the same stored form.
  const dummyHash = createDummyHash(scryptParams);

  const signedIn = async (ctx: HandlerContext, memberId: string, at: Date, tx: Knex | Knex.Transaction = db): Promise<void> => {
    const token = await startSession(tx, memberId, policy, at);
    ctx.responseHeader.append("set-cookie", setSessionCookie(cookie, token, policy.absoluteMs));
  };

  return withStorableText({
    ...createEvaluationMethods({ db, now, wakeRunner: deps.wakeEvaluationRunner ?? (() => {}) }),

    async acceptInvite(req, ctx) {
      const problem = passwordProblem(req.password);
      throwIfInvalid(problem ? [{ field: "password", rule: problem }] : []);
      throwIfInvalid(req.inviteToken === "" ? [{ field: "invite_token", rule: "required: the token of the invite link" }] : []);
      // A dead invite costs one indexed read: no strength check, no scrypt, for a caller with nothing to accept.
      const invitedId = await findLiveInvite(db, req.inviteToken, now());
      if (!invitedId) throw inviteInvalid();
      const invited = await findMember(db, invitedId);
      const weak = passwordStrengthProblem(req.password, invited ? [invited.email] : []);
      throwIfInvalid(weak ? [{ field: "password", rule: weak }] : []);
      // Hashed before the transaction: it takes a while, and holds no connection meanwhile.
      const passwordHash = await passwordWork.run(clientOf(ctx), () => hashPassword(req.password, scryptParams), retryAfter(ctx));
      const at = now();
      const member = await db.transaction(async (tx) => {
        const memberId = await consumeInvite(tx, req.inviteToken, at);
        if (!memberId) return undefined;
        await setPasswordHash(tx, memberId, passwordHash);
        // A new password (a second invite serves as a reset) ends every session the old one started.
        await endMemberSessions(tx, memberId, at);
        const row = (await findMember(tx, memberId))!;
        await recordActivity(tx, { accountId: row.account_id, kind: "invite_accepted", actor: row.email, detail: `as ${row.role}`, at });
        await endPreviousSession(tx, ctx, at);
        await signedIn(ctx, row.id, at, tx);
        return row;
      });
      if (!member) throw inviteInvalid();
      return { member: memberMessage({ ...member, password_hash: "" }) };
    },

    async signIn(req, ctx) {
      const email = normalizeEmail(req.email);
      const chars = passwordLength(req.password);
      throwIfInvalid([
        ...(email === "" || email.length > MAX_EMAIL_CHARS || /[\p{Cc}\p{Cs}]/u.test(email)
          ? [{ field: "email", rule: `required, at most ${MAX_EMAIL_CHARS} characters, no control characters` }]
          : []),
        ...(email !== "" && email.length <= MAX_EMAIL_CHARS && emailProblem(email) ? [{ field: "email", rule: emailProblem(email)! }] : []),
        ...(chars === 0 || chars > MAX_PASSWORD_CHARS ? [{ field: "password", rule: `required, at most ${MAX_PASSWORD_CHARS} characters` }] : []),
      ]);
      // The queue is asked first: a refused attempt is not counted against the email.
      return passwordWork.run(
        clientOf(ctx),
        async () => {
          const retryAfterMs = await countSignInAttempt(db, email, now());
          if (retryAfterMs !== undefined) {
            deps.metrics?.recordSignIn("throttled");
            throw throttled(ctx, retryAfterMs);
          }
          const member = await findMemberByEmail(db, email);
          // An unknown email, or a member who has not set a password yet, costs the same scrypt work as a wrong password.
          const matches = await verifyPassword(req.password, member?.password_hash ?? dummyHash, scryptParams);
          const at = now();
          if (!member || member.password_hash === null || !matches) {
            deps.metrics?.recordSignIn("failed");
            if (member) await recordActivity(db, { accountId: member.account_id, kind: "sign_in_failed", actor: member.email, at });
            throw apiError("SIGN_IN_FAILED", "wrong email or password");
          }
          if (member.totp_enabled_at !== null) {
            // The password was right; no session until the second step passes.
            const secondStepToken = await db.transaction(async (tx) => {
              await clearSignInAttempts(tx, email);
              return createSignInChallenge(tx, member.id, at);
            });
            return { secondStepToken };
          }
          await db.transaction(async (tx) => {
            await clearSignInAttempts(tx, email);
            await endPreviousSession(tx, ctx, at);
            await signedIn(ctx, member.id, at, tx);
            await recordActivity(tx, { accountId: member.account_id, kind: "signed_in", actor: member.email, at });
          });
          deps.metrics?.recordSignIn("ok");
          return { member: memberMessage(member) };
        },
        retryAfter(ctx),
      );
    },

    async signInSecondStep(req, ctx) {
      throwIfInvalid([
        ...(req.secondStepToken === "" ? [{ field: "second_step_token", rule: "required: the second_step_token of SignIn" }] : []),
        ...((req.code === "") === (req.recoveryCode === "") ? [{ field: "code", rule: "exactly one of code and recovery_code" }] : []),
        ...(req.code.length > 16 ? [{ field: "code", rule: "6 digits" }] : []),
        ...(req.recoveryCode.length > 32 ? [{ field: "recovery_code", rule: "a recovery code (10 letters and digits)" }] : []),
      ]);
      const at = now();
      const member = await findSignInChallenge(db, req.secondStepToken, at);
      if (!member) throw secondStepFailed();
      // The second step has its own count, which a right password does not clear: guessing codes stays bounded.
      const retryAfterMs = await countSignInAttempt(db, secondStepThrottleKey(member.id), at);
      if (retryAfterMs !== undefined) {
        deps.metrics?.recordSignIn("throttled");
        throw throttled(ctx, retryAfterMs);
      }
      const passed = req.code !== "" ? await useTotpCode(db, member, req.code, at) : await useRecoveryCode(db, member.id, req.recoveryCode, at);
      if (!passed) {
        deps.metrics?.recordSignIn("failed");
        await recordActivity(db, { accountId: member.account_id, kind: "sign_in_failed", actor: member.email, detail: "second step", at });
        throw secondStepFailed();
      }
      const signedInNow = await db.transaction(async (tx) => {
        if (!(await consumeSignInChallenge(tx, req.secondStepToken, at))) return false;
        await clearSignInAttempts(tx, secondStepThrottleKey(member.id));
        await endPreviousSession(tx, ctx, at);
        await signedIn(ctx, member.id, at, tx);
        const how = req.code !== "" ? "with an authenticator code" : "with a recovery code";
        await recordActivity(tx, { accountId: member.account_id, kind: "signed_in", actor: member.email, detail: how, at });
        return true;
      });
      if (!signedInNow) throw secondStepFailed();
      deps.metrics?.recordSignIn("ok");
      return { member: memberMessage(member) };
    },

    async signOut(_req, ctx) {
      const token = ctx.values.get(kSessionToken);
      const at = now();
      ctx.responseHeader.append("set-cookie", clearSessionCookie(cookie));
      if (token === undefined) return {};
      await db.transaction(async (tx) => {
        const ended = await endSession(tx, token, at);
        if (ended) await recordActivity(tx, { accountId: ended.accountId, kind: "signed_out", actor: ended.email, at });
      });
      return {};
    },

    async getAccount(_req, ctx) {
      // Read by every member, also one who must still enroll a second factor: the page learns from it what to show.
      const member = memberOf(ctx);
      const [money, row, alerts] = await Promise.all([readAccountMoney(db, member.accountId), findMember(db, member.memberId), readAlertSettings(db, member.accountId)]);
      if (!money || !row) throw apiError("SIGNED_OUT", "not signed in, or the session ended: sign in to the account area");
      return {
        member: memberMessage(row),
        account: {
          id: money.id,
          name: money.name,
          balanceCredits: unitsToCredits(money.balanceUnits),
          heldCredits: unitsToCredits(money.heldUnits),
          availableCredits: unitsToCredits(money.availableUnits),
          freeRequestsRemaining: money.freeAvailable,
          limits: { maxInFlight: money.maxInFlight, requestsPerMinute: money.requestsPerMinute },
          callsInFlight: money.inFlight,
          createdAt: timestampFromDate(money.createdAt),
          twoFactorRequired: member.twoFactorRequired,
          balanceLow: alerts !== undefined && (alerts.crossedUnits.length > 0 || alerts.depleted),
        },
      };
    },

    // Every member reads alerts, endpoints and deliveries; owners and admins change them.
    async getAlerts(_req, ctx) {
      const member = allowed(ctx, "read");
      return { alerts: alertsMessage((await readAlertSettings(db, member.accountId))!) };
    },

    async setAlerts(req, ctx) {
      const member = allowed(ctx, "manage_alerts");
      const { units, violations } = thresholdViolations("thresholds_credits", req.thresholdsCredits);
      throwIfInvalid(violations);
      const at = now();
      const settings = await db.transaction(async (tx) => {
        const set = await setAlertSettings(tx, member.accountId, units, DECISION_RESERVE_UNITS_PER_QUESTION);
        await recordActivity(tx, { accountId: member.accountId, kind: "alerts_set", actor: member.email, detail: creditsList(units), at });
        return set!;
      });
      deps.webhooks.wake();
      return { alerts: alertsMessage(settings) };
    },

    async listWebhookEndpoints(_req, ctx) {
      const member = allowed(ctx, "read");
      return { endpoints: (await listEndpoints(db, member.accountId)).map(endpointMessage) };
    },

    async addWebhookEndpoint(req, ctx) {
      const member = allowed(ctx, "manage_alerts");
      const url = req.url.trim();
      throwIfInvalid(endpointUrlViolations("url", url, deps.webhooks.allowLoopback));
      const added = await addEndpoint(db, member.accountId, url, { actor: member.email, at: now() });
      throwIfInvalid(added ? [] : [{ field: "url", rule: `at most ${MAX_ENDPOINTS} endpoints per account` }]);
      // Balance alerts are watched once an account has somewhere to send them.
      const alerts = await readAlertSettings(db, member.accountId);
      if (alerts?.depletionFloorUnits === undefined) await setAlertSettings(db, member.accountId, alerts?.thresholdsUnits ?? [], DECISION_RESERVE_UNITS_PER_QUESTION);
      return { endpoint: endpointMessage(added!.endpoint), secret: added!.secret };
    },

    async removeWebhookEndpoint(req, ctx) {
      const member = allowed(ctx, "manage_alerts");
      if (!(await removeEndpoint(db, member.accountId, await ownEndpointId(member.accountId, req.endpointId), { actor: member.email, at: now() }))) throw noSuchEndpoint();
      return {};
    },

    async rotateWebhookSecret(req, ctx) {
      const member = allowed(ctx, "manage_alerts");
      const rotated = await rotateSecret(db, member.accountId, await ownEndpointId(member.accountId, req.endpointId), { actor: member.email, at: now() });
      if (!rotated) throw noSuchEndpoint();
      return { endpoint: endpointMessage(rotated.endpoint), secret: rotated.secret };
    },

    async enableWebhookEndpoint(req, ctx) {
      const member = allowed(ctx, "manage_alerts");
      const enabled = await enableEndpoint(db, member.accountId, await ownEndpointId(member.accountId, req.endpointId), { actor: member.email, at: now() });
      if (!enabled) throw noSuchEndpoint();
      deps.webhooks.wake();
      return { endpoint: endpointMessage(enabled) };
    },

    async sendTestWebhook(req, ctx) {
      const member = allowed(ctx, "manage_alerts");
      const webhookId = await sendTestEvent(db, member.accountId, await ownEndpointId(member.accountId, req.endpointId));
      deps.webhooks.wake();
      return { webhookId };
    },

    async listWebhookDeliveries(req, ctx) {
      const member = allowed(ctx, "read");
      throwIfInvalid(req.pageSize < 0 || req.pageSize > 100 ? [{ field: "page_size", rule: "0 to 100" }] : []);
      return { deliveries: (await listDeliveries(db, member.accountId, req.pageSize || 20)).map(deliveryMessage) };
    },

    async replayWebhookDelivery(req, ctx) {
      const member = allowed(ctx, "manage_alerts");
      if (!(await replayDelivery(db, member.accountId, req.deliveryId, now()))) {
        throw apiError("NOT_FOUND", "delivery_id: no such finished delivery", { field: "delivery_id", rule: "a delivered or failed delivery of your account" });
      }
      deps.webhooks.wake();
      return {};
    },

    async listKeys(req, ctx) {
      const member = allowed(ctx, "read");
      const size = pageSize(req.pageSize);
      const position = keyCursor(req.pageToken);
      const { keys, more } = await listAccountKeys(db, member.accountId, { size, after: position && { createdAt: position.at, id: position.id } });
      const last = keys.at(-1);
      return { keys: keys.map(keyMessage), nextPageToken: more && last ? encodePageToken(last.created_at, last.id) : "" };
    },

    async createKey(req, ctx) {
      const member = allowed(ctx, "manage_keys");
      const name = req.name.trim();
      throwIfInvalid(
        [...name].length > MAX_KEY_NAME_CHARS || /[\p{Cc}\p{Cf}]/u.test(name)
          ? [{ field: "name", rule: `at most ${MAX_KEY_NAME_CHARS} characters, no control characters` }]
          : [],
      );
      const at = now();
      const limits = req.limits ? await checkedLimits(member.accountId, req.limits, at, "limits") : NO_KEY_LIMITS;
      const { apiKey, keyId } = await db.transaction(async (tx) => {
        if ((await countLiveKeysLocked(tx, member.accountId)) >= deps.maxKeysPerAccount) {
          throw apiError("KEY_LIMIT_REACHED", `this account has ${deps.maxKeysPerAccount} live keys, the most it may have: revoke one first`, {
            metadata: { max_keys: String(deps.maxKeysPerAccount) },
          });
        }
        const created = await createApiKey(tx, member.accountId, { name, createdBy: member.email });
        await setKeyLimits(tx, member.accountId, created.keyId, limits);
        await recordActivity(tx, { accountId: member.accountId, kind: "key_created", actor: member.email, detail: keyLabel(created.row), at });
        return created;
      });
      return { key: await keyOfAccount(member.accountId, keyId), secret: apiKey };
    },

    async updateKey(req, ctx) {
      const member = allowed(ctx, "manage_keys");
      const at = now();
      const limits = await checkedLimits(member.accountId, req.limits, at, "limits");
      const updated = await db.transaction((tx) => changeKeyLimits(tx, member.accountId, req.keyId, limits, { actor: member.email, at }));
      // A revoked key, another account's, an unknown id and a malformed one all get this answer.
      if (!updated) throw apiError("NOT_FOUND", "key_id: no such key that works", { field: "key_id", rule: "a live key of your account" });
      return { key: await keyOfAccount(member.accountId, req.keyId) };
    },

    async rollKey(req, ctx) {
      const member = allowed(ctx, "manage_keys");
      const grace = req.oldKeyExpiresInSeconds;
      throwIfInvalid(
        grace < 0 || grace > MAX_ROLL_GRACE_SECONDS
          ? [{ field: "old_key_expires_in_seconds", rule: `from 0 (at once) to ${MAX_ROLL_GRACE_SECONDS} (7 days)` }]
          : [],
      );
      const at = now();
      const rolled = await db.transaction(async (tx) => {
        const result = await rollKey(tx, member.accountId, req.keyId, { graceSeconds: grace, now: at, createdBy: member.email });
        if (result) {
          const detail = `${keyLabel(result.newKey)}, rolled from ${keyLabel(result.oldKey)} (which stops at ${result.oldKey.expires_at!.toISOString()})`;
          await recordActivity(tx, { accountId: member.accountId, kind: "key_rolled", actor: member.email, detail, at });
        }
        return result;
      });
      if (!rolled) throw apiError("NOT_FOUND", "key_id: no such key that works", { field: "key_id", rule: "a live key of your account" });
      return {
        key: await keyOfAccount(member.accountId, rolled.newKeyId),
        secret: rolled.apiKey,
        oldKey: await keyOfAccount(member.accountId, req.keyId),
      };
    },

    async revokeKey(req, ctx) {
      const member = allowed(ctx, "manage_keys");
      const at = now();
      const key = await db.transaction(async (tx) => {
        const revoked = await revokeAccountKey(tx, member.accountId, req.keyId, at);
        if (revoked?.revokedNow) {
          await recordActivity(tx, { accountId: member.accountId, kind: "key_revoked", actor: member.email, detail: keyLabel(revoked.key), at });
        }
        return revoked?.key;
      });
      // Another account's key, an unknown id and a malformed one get this same answer.
      if (!key) throw apiError("NOT_FOUND", "key_id: no such key", { field: "key_id", rule: "a key of your account" });
      return { key: keyMessage(key) };
    },

    async listUsage(req, ctx) {
      const member = allowed(ctx, "read");
      const filter = usageFilter({ endpoint: req.endpoint, since: optionalDate(req.since, "since"), until: optionalDate(req.until, "until"), keyId: req.keyId });
      const size = pageSize(req.pageSize);
      const after = callCursor(req.pageToken);
      const { calls, more } = await listFinishedCalls(db, member.accountId, filter, { size, after });
      const last = calls.at(-1);
      return {
        records: calls.map((call) => ({
          requestId: call.requestId,
          endpoint: call.endpoint,
          keyId: call.keyId,
          evaluationId: call.evaluationId,
          funding: call.funding,
          reservedCredits: unitsToCredits(call.reservedUnits),
          chargedCredits: unitsToCredits(call.chargedUnits),
          status: call.status,
          startedAt: timestampFromDate(call.startedAt),
          finishedAt: timestampFromDate(call.finishedAt),
        })),
        nextPageToken: more && last ? encodePageToken(last.startedAt, last.requestId) : "",
      };
    },

    async getUsageSummary(req, ctx) {
      const member = allowed(ctx, "read");
      const granularity = req.granularity === "" ? "day" : req.granularity;
      throwIfInvalid(granularity !== "day" && granularity !== "hour" ? [{ field: "granularity", rule: '"day", "hour" or empty' }] : []);
      const unit = granularity as "day" | "hour";
      const until = optionalDate(req.until, "until") ?? now();
      const since = optionalDate(req.since, "since") ?? new Date(until.getTime() - 30 * DAY_MS);
      throwIfInvalid([
        ...(since.getTime() >= until.getTime() ? [{ field: "since", rule: "must be before until" }] : []),
        ...(until.getTime() - since.getTime() > MAX_SUMMARY_DAYS[unit] * DAY_MS
          ? [{ field: "since", rule: `at most ${MAX_SUMMARY_DAYS[unit]} days before until when counting per ${unit}` }]
          : []),
      ]);
      const { keyId } = usageFilter({ endpoint: "", keyId: req.keyId });
      const buckets = await summarizeCalls(db, member.accountId, { since, until, granularity: unit, keyId, byKey: req.groupByKey });
      return {
        buckets: buckets.map((b) => ({
          start: timestampFromDate(b.start),
          endpoint: b.endpoint,
          keyId: b.keyId,
          calls: b.calls,
          chargedCredits: unitsToCredits(b.chargedUnits),
        })),
      };
    },

    async listActivity(req, ctx) {
      const member = allowed(ctx, "read");
      const size = pageSize(req.pageSize);
      const position = activityCursor(req.pageToken);
      const { rows, more } = await listActivity(db, member.accountId, { size, after: position });
      const last = rows.at(-1);
      return {
        events: rows.map((row: DbActivityRow) => ({ id: row.id, kind: row.kind, actor: row.actor, detail: row.detail, at: timestampFromDate(row.at) })),
        nextPageToken: more && last ? encodePageToken(last.at, last.id) : "",
      };
    },

    async listMembers(_req, ctx) {
      const member = allowed(ctx, "read");
      return { members: (await listMembers(db, member.accountId)).map(memberMessage) };
    },

    async inviteMember(req, ctx) {
      const actor = allowed(ctx, "manage_members");
      const email = normalizeEmail(req.email);
      const role = requestedRole(req.role === "" ? "member" : req.role);
      const problem = emailProblem(email);
      throwIfInvalid(problem ? [{ field: "email", rule: problem }] : []);
      refuseChange(actor.role, { to: role });
      const at = now();
      const invited = await db.transaction(async (tx) => {
        const pending = await findMemberByEmail(tx, email);
        if (pending && pending.account_id === actor.accountId) refuseChange(actor.role, { from: pending.role, to: role });
        const outcome = await inviteTeamMember(tx, actor.accountId, email, role, at);
        if (typeof outcome === "string") return outcome;
        await recordActivity(tx, { accountId: actor.accountId, kind: "member_invited", actor: actor.email, detail: `${email} as ${role}`, at });
        return outcome;
      });
      if (invited === "last_owner") throw lastOwner();
      if (typeof invited === "string") {
        // The same answer whether the email is a member here or in another account: it tells nothing of other accounts.
        throw apiError("INVALID_ARGUMENT", "email: this person is already a member; a member who lost their password asks the operator", {
          field: "email",
          rule: "not already a member of an account",
        });
      }
      return {
        member: memberMessage(invited.member),
        inviteUrl: inviteUrl(deps.publicUrl, invited.invite.token),
        expiresAt: timestampFromDate(invited.invite.expiresAt),
      };
    },

    async removeMember(req, ctx) {
      const actor = allowed(ctx, "manage_members");
      const at = now();
      const removed = await db.transaction(async (tx) => {
        const target = await findTeamMember(tx, actor.accountId, req.memberId);
        if (!target) return undefined;
        refuseChange(actor.role, { from: target.role });
        return removeTeamMember(tx, { accountId: actor.accountId, memberId: target.id, actor: actor.email, keepKeys: req.keepKeys, now: at });
      });
      if (removed === "last_owner") throw lastOwner();
      if (!removed) throw memberNotFound();
      const keyIds = (keys: Array<{ id: string }>) => keys.map((key) => key.id);
      return {
        member: memberMessage(removed.member),
        sessionsEnded: removed.sessionsEnded,
        revokedKeyIds: keyIds(removed.keysRevoked),
        keptKeyIds: keyIds(removed.keysKept),
      };
    },

    async setMemberRole(req, ctx) {
      const actor = allowed(ctx, "manage_members");
      const role = requestedRole(req.role);
      const at = now();
      const changed = await db.transaction(async (tx) => {
        const target = await findTeamMember(tx, actor.accountId, req.memberId);
        if (!target) return undefined;
        refuseChange(actor.role, { from: target.role, to: role });
        const outcome = await changeMemberRole(tx, actor.accountId, target.id, role);
        if (outcome === "last_owner" || outcome === undefined) return outcome;
        if (outcome.previous !== role) {
          const detail = `${outcome.member.email}: ${outcome.previous} to ${role}`;
          await recordActivity(tx, { accountId: actor.accountId, kind: "member_role_changed", actor: actor.email, detail, at });
        }
        return outcome;
      });
      if (changed === "last_owner") throw lastOwner();
      if (!changed) throw memberNotFound();
      return { member: memberMessage(changed.member) };
    },

    async startTwoFactorEnrollment(_req, ctx) {
      // Every member secures their own sign-in, whatever their role, and also while the account requires it.
      const member = memberOf(ctx);
      if (member.twoFactorEnabled) {
        throw apiError("INVALID_ARGUMENT", "two-factor sign-in is already on: disable it first to enroll a new authenticator", {
          rule: "two-factor sign-in is off",
        });
      }
      const secret = newTotpSecret();
      await startTotpEnrollment(db, member.memberId, secret);
      return { secret, otpauthUri: totpUri(secret, member.email) };
    },

    async confirmTwoFactorEnrollment(req, ctx) {
      const member = memberOf(ctx);
      throwIfInvalid(req.code === "" || req.code.length > 16 ? [{ field: "code", rule: "required: a 6-digit code of the authenticator" }] : []);
      const at = now();
      const codes = await db.transaction(async (tx) => {
        const row = await tx<DbMemberRow>("members").where({ id: member.memberId }).forUpdate().first();
        if (!row || row.totp_enabled_at !== null) return undefined;
        const recoveryCodes = await confirmTotpEnrollment(tx, row, req.code, at);
        if (!recoveryCodes) return undefined;
        // Sessions opened with the password alone would outlive the new rule: only the one that turned it on stays.
        const current = ctx.values.get(kSessionToken);
        const ended = await endMemberSessions(tx, member.memberId, at, current === undefined ? undefined : { token: current });
        const detail = ended > 0 ? `${ended} other session${ended === 1 ? "" : "s"} ended` : undefined;
        await recordActivity(tx, { accountId: member.accountId, kind: "two_factor_enabled", actor: member.email, detail, at });
        return recoveryCodes;
      });
      if (!codes) {
        throw apiError("INVALID_ARGUMENT", "code: not a current code of the secret being enrolled; start enrollment, then type the code the app shows", {
          field: "code",
          rule: "a current code of the secret StartTwoFactorEnrollment gave",
        });
      }
      return { recoveryCodes: codes };
    },

    async disableTwoFactor(req, ctx) {
      const member = memberOf(ctx);
      throwIfInvalid((req.code === "") === (req.recoveryCode === "") ? [{ field: "code", rule: "exactly one of code and recovery_code" }] : []);
      if (member.twoFactorRequired) throw apiError("TWO_FACTOR_REQUIRED", TWO_FACTOR_KEPT_RULE, { rule: TWO_FACTOR_KEPT_RULE });
      const at = now();
      const retryAfterMs = await countSignInAttempt(db, secondStepThrottleKey(member.memberId), at);
      if (retryAfterMs !== undefined) throw throttled(ctx, retryAfterMs);
      const disabled = await db.transaction(async (tx) => {
        const row = await tx<DbMemberRow>("members").where({ id: member.memberId }).forUpdate().first();
        if (!row || row.totp_enabled_at === null) return false;
        const passed = req.code !== "" ? await useTotpCode(tx, row, req.code, at) : await useRecoveryCode(tx, row.id, req.recoveryCode, at);
        if (!passed) return false;
        await disableTotp(tx, row.id, at);
        await recordActivity(tx, { accountId: member.accountId, kind: "two_factor_disabled", actor: member.email, at });
        return true;
      });
      if (!disabled) throw secondStepFailed();
      await clearSignInAttempts(db, secondStepThrottleKey(member.memberId));
      return {};
    },

    async setTwoFactorRequired(req, ctx) {
      const member = allowed(ctx, "require_two_factor");
      // An owner without a second factor would be refused by their own rule at once.
      if (req.required && !member.twoFactorEnabled) {
        throw apiError("TWO_FACTOR_REQUIRED", "enroll your own second factor before requiring one of every member", {
          rule: "the owner who requires two-factor sign-in has it on",
        });
      }
      const at = now();
      await db.transaction(async (tx) => {
        await setTwoFactorRequired(tx, member.accountId, req.required);
        await recordActivity(tx, { accountId: member.accountId, kind: "two_factor_required_changed", actor: member.email, detail: req.required ? "required" : "optional", at });
      });
      return {};
    },
  });

  /** Limits as the request states them, checked against the account's own rate limit; a 400 names the field. */
  async function checkedLimits(accountId: string, message: KeyLimitsMessage | undefined, at: Date, fieldPath: string): Promise<KeyLimits> {
    const money = await readAccountMoney(db, accountId);
    const parsed = parseKeyLimits(
      {
        expiresAt: message?.expiresAt ? timestampDate(message.expiresAt) : undefined,
        scopes: message?.scopes ?? [],
        budgetCredits: message?.budgetCredits,
        budgetPeriod: message?.budgetPeriod ?? "",
        rateLimit: message?.requestsPerMinute ?? 0,
      },
      { now: at, accountRateLimit: money?.requestsPerMinute ?? 0, fieldPath },
    );
    throwIfInvalid(parsed.violations);
    return (parsed as { limits: KeyLimits }).limits;
  }

  async function keyOfAccount(accountId: string, keyId: string): Promise<ApiKey> {
    const key = await findAccountKey(db, accountId, keyId);
    if (!key) throw apiError("NOT_FOUND", "key_id: no such key", { field: "key_id", rule: "a key of your account" });
    return keyMessage(key);
  }

  /** The endpoint's id when it is the account's own; otherwise the same NOT_FOUND as an unknown id. */
  async function ownEndpointId(accountId: string, endpointId: string): Promise<string> {
    if (!isUuid(endpointId) || !(await findEndpoint(db, accountId, endpointId))) throw noSuchEndpoint();
    return endpointId;
  }

  /** A new session replaces the one the browser had, so two never share a cookie. */
  async function endPreviousSession(tx: Knex.Transaction, ctx: HandlerContext, at: Date): Promise<void> {
    const previous = ctx.values.get(kSessionToken);
    if (previous !== undefined) await endSession(tx, previous, at);
  }
}

/**
 * Every method checks its request's text before anything else runs: no
 * U+0000 or lone surrogate in any field reaches the store, whichever surface
 * the call came through.
 */
function withStorableText(impl: ServiceImpl<typeof AccountService>): ServiceImpl<typeof AccountService> {
  const checked: Record<string, (req: Message, ctx: HandlerContext) => unknown> = {};
  for (const method of AccountService.methods) {
    const handler = impl[method.localName as keyof typeof impl] as unknown as (req: Message, ctx: HandlerContext) => unknown;
    checked[method.localName] = (req, ctx) => {
      throwIfInvalid(storableTextViolations(method.input, req));
      return handler.call(impl, req, ctx);
    };
  }
  return checked as unknown as ServiceImpl<typeof AccountService>;
}

/** The rule that keeps a second factor on while the account requires one. */
const TWO_FACTOR_KEPT_RULE = "the account requires two-factor sign-in: an owner must make it optional first";

function memberMessage(member: DbMemberRow): Member {
  return create(MemberSchema, {
    id: member.id,
    email: member.email,
    accountId: member.account_id,
    role: member.role,
    twoFactorEnabled: member.totp_enabled_at !== null,
    inviteAccepted: member.password_hash !== null,
    createdAt: timestampFromDate(member.created_at),
  });
}

/** The role a request names, or a 400 naming the field. */
function requestedRole(role: string): Role {
  if (!isRole(role)) throw apiError("INVALID_ARGUMENT", `role: one of ${ROLES.join(", ")}`, { field: "role", rule: `one of ${ROLES.join(", ")}` });
  return role;
}

/** Refuses a change to a member that the actor's role does not allow. */
function refuseChange(actor: Role, change: { from?: Role; to?: Role }): void {
  const rule = memberChangeRefusal(actor, change);
  if (rule) throw apiError("ROLE_FORBIDDEN", `${rule} (your role: ${actor})`, { rule, metadata: { role: actor, action: rule === OWNER_ROLE_RULE ? "owner_role" : "manage_members" } });
}

function lastOwner() {
  return apiError("LAST_OWNER", LAST_OWNER_RULE, { field: "member_id", rule: LAST_OWNER_RULE });
}

/** Another account's member, an unknown id and a malformed one get this same answer. */
function memberNotFound() {
  return apiError("NOT_FOUND", "member_id: no such member", { field: "member_id", rule: "a member of your account" });
}

function secondStepFailed() {
  return apiError("SECOND_STEP_FAILED", "wrong or used code, or the sign-in took too long: sign in again if it keeps failing");
}

/**
 * The second step's throttle counts per member, apart from the password's.
 * The key has a space, which no email SignIn counts has, so failed
 * passwords cannot use up a member's second step.
 */
function secondStepThrottleKey(memberId: string): string {
  return `second step ${memberId}`;
}

function throttled(ctx: HandlerContext, retryAfterMs: number) {
  const seconds = String(Math.ceil(retryAfterMs / 1000));
  ctx.responseHeader.set("retry-after", seconds);
  return apiError("SIGN_IN_THROTTLED", `too many failed sign-ins for this email: try again in ${seconds} s`, {
    metadata: { retry_after_seconds: seconds, retry_after_ms: String(retryAfterMs) },
  });
}

function inviteInvalid(): Error {
  return apiError("INVITE_INVALID", "invite_token: this invite is unknown, used or expired; ask for a new one", { field: "invite_token", rule: "a live invite" });
}

/** Who the password work is counted against: the peer's address. */
function clientOf(ctx: HandlerContext): string {
  return ctx.values.get(kRemoteAddress);
}

/** Puts a refusal's delay in Retry-After, as every 429 of the service does. */
function retryAfter(ctx: HandlerContext): (seconds: number) => void {
  return (seconds) => ctx.responseHeader.set("retry-after", String(seconds));
}

/** A key as a member sees it: never its secret or hash. */
function keyMessage(key: AccountKeyRow): ApiKey {
  return create(ApiKeySchema, {
    id: key.id,
    name: key.name,
    prefix: KEY_PREFIX,
    last4: key.last4,
    createdAt: timestampFromDate(key.created_at),
    createdBy: key.created_by,
    lastUsedAt: key.last_used_at ? timestampFromDate(key.last_used_at) : undefined,
    revokedAt: key.revoked_at ? timestampFromDate(key.revoked_at) : undefined,
    limits: limitsMessage(keyLimitsOf(key)),
    budgetUsage: key.budget_units === null || key.budget_period === null ? undefined : budgetUsageMessage(key),
    keptBy: key.kept_by ?? "",
    keptAt: key.kept_at ? timestampFromDate(key.kept_at) : undefined,
  });
}

function limitsMessage(limits: KeyLimits) {
  return {
    expiresAt: limits.expiresAt ? timestampFromDate(limits.expiresAt) : undefined,
    scopes: limits.scopes,
    budgetCredits: limits.budget ? unitsToCredits(limits.budget.units) : undefined,
    budgetPeriod: limits.budget?.period ?? "",
    requestsPerMinute: limits.rateLimit ?? 0,
  };
}

function budgetUsageMessage(key: AccountKeyRow) {
  const spent = Number(key.spent_units);
  const held = Number(key.held_units);
  const end = key.period_start && key.budget_period ? periodEnd(key.budget_period, key.period_start) : null;
  return {
    spentCredits: unitsToCredits(spent),
    heldCredits: unitsToCredits(held),
    leftCredits: unitsToCredits(Math.max(Number(key.budget_units) - spent - held, 0)),
    periodStart: key.period_start ? timestampFromDate(key.period_start) : undefined,
    periodEnd: end ? timestampFromDate(end) : undefined,
  };
}

/** A request's time, checked: a Timestamp out of range (binary callers can send any seconds) is a 400. */
function optionalDate(timestamp: Timestamp | undefined, field: string): Date | undefined {
  return checkedTime(timestamp ? timestampDate(timestamp) : undefined, field);
}

function noSuchEndpoint() {
  return apiError("NOT_FOUND", "endpoint_id: no such endpoint", { field: "endpoint_id", rule: "an endpoint of your account" });
}

function alertsMessage(settings: AlertSettings) {
  return {
    thresholdsCredits: settings.thresholdsUnits.map(unitsToCredits),
    crossedCredits: settings.crossedUnits.map(unitsToCredits),
    depleted: settings.depleted,
  };
}

function creditsList(units: readonly number[]): string {
  return units.length === 0 ? "no thresholds" : units.map((u) => `${unitsToCredits(u)} credits`).join(", ");
}

function endpointMessage(endpoint: WebhookEndpointView) {
  return {
    id: endpoint.id,
    url: endpoint.url,
    enabled: endpoint.enabled,
    disabledReason: endpoint.disabledReason,
    createdAt: timestampFromDate(endpoint.createdAt),
    previousSecretUntil: endpoint.previousSecretUntil ? timestampFromDate(endpoint.previousSecretUntil) : undefined,
  };
}

function deliveryMessage(delivery: DeliveryView) {
  return {
    id: delivery.id,
    endpointId: delivery.endpointId,
    webhookId: delivery.webhookId,
    eventType: delivery.eventType,
    eventAt: timestampFromDate(delivery.eventAt),
    state: delivery.state,
    nextAttemptAt: delivery.nextAttemptAt ? timestampFromDate(delivery.nextAttemptAt) : undefined,
    attempts: delivery.attempts.map((a) => ({ attempt: a.attempt, at: timestampFromDate(a.at), status: a.status ?? 0, latencyMs: a.latencyMs, error: a.error })),
  };
}
