import { create } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { Knex } from "knex";
import { listActivity, recordActivity, type DbActivityRow } from "../accounts/activity.js";
import { KEY_PREFIX } from "../accounts/api-keys.js";
import { consumeInvite } from "../accounts/invites.js";
import { findMember, findMemberByEmail, MAX_EMAIL_CHARS, normalizeEmail, setPasswordHash } from "../accounts/members.js";
import { createDummyHash, hashPassword, MAX_PASSWORD_CHARS, passwordProblem, SCRYPT_PARAMS, verifyPassword, type ScryptParams } from "../accounts/passwords.js";
import { endMemberSessions, endSession, startSession, type SessionMember, type SessionPolicy } from "../accounts/sessions.js";
import { clearSignInAttempts, countSignInAttempt } from "../accounts/sign-in-throttle.js";
import { createApiKey, isUuid, listAccountKeys, revokeAccountKey, type AccountKeyRow } from "../accounts/store.js";
import { apiError } from "../errors.js";
import {
  AccountService,
  type ApiKey,
  type Member,
  ApiKeySchema,
  MemberSchema,
} from "../gen/typesafe/account/v1/account_service_pb.js";
import { listFinishedCalls, readAccountMoney, summarizeCalls } from "../metering/account-views.js";
import type { Metrics } from "../metrics.js";
import { unitsToCredits } from "../units.js";
import { throwIfInvalid } from "../validation.js";
import { clearSessionCookie, setSessionCookie, type SessionCookie } from "./cookie.js";
import { kSessionToken, memberOf } from "./door.js";
import { callCursor, decodePageToken, encodePageToken, pageSize, usageFilter } from "./usage-query.js";
import { DECISION_RESERVE_UNITS_PER_QUESTION } from "../metering/meter.js";
import { listDeliveries, replayDelivery, sendTestEvent, type DeliveryView } from "../webhooks/deliveries.js";
import { addEndpoint, enableEndpoint, findEndpoint, listEndpoints, MAX_ENDPOINTS, removeEndpoint, rotateSecret, type WebhookEndpointView } from "../webhooks/endpoints.js";
import { endpointUrlViolations } from "../webhooks/endpoint-url.js";
import { readAlertSettings, setAlertSettings, type AlertSettings } from "../webhooks/events.js";
import { thresholdViolations } from "../webhooks/thresholds.js";

/** The longest key name. */
export const MAX_KEY_NAME_CHARS = 64;
/** The widest range GetUsageSummary counts, per granularity (a bound on the buckets one call returns). */
export const MAX_SUMMARY_DAYS = { day: 400, hour: 31 } as const;
const DAY_MS = 86_400_000;

export interface AccountServiceDeps {
  db: Knex;
  cookie: SessionCookie;
  policy: SessionPolicy;
  now: () => Date;
  metrics?: Pick<Metrics, "recordSignIn">;
  /** The cost of new password hashes (tests lower it; stored hashes keep their own). */
  scryptParams?: ScryptParams;
  /** Whether endpoints may be on loopback (development only), and a nudge to the deliverer when something is due now. */
  webhooks: { allowLoopback: boolean; wake: () => void };
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
  // Made once, up front, so that even the first sign-in of an unknown email costs only the verification.
  const dummyHash = createDummyHash(scryptParams);

  const signedIn = async (ctx: HandlerContext, member: SessionMember, at: Date, tx: Knex | Knex.Transaction = db): Promise<void> => {
    const token = await startSession(tx, member.memberId, policy, at);
    ctx.responseHeader.append("set-cookie", setSessionCookie(cookie, token, policy.absoluteMs));
  };

  return {
    async acceptInvite(req, ctx) {
      const problem = passwordProblem(req.password);
      throwIfInvalid(problem ? [{ field: "password", rule: problem }] : []);
      throwIfInvalid(req.inviteToken === "" ? [{ field: "invite_token", rule: "required: the token of the invite link" }] : []);
      // Hashed before the transaction: it takes a while, and holds no connection meanwhile.
      const passwordHash = await hashPassword(req.password, scryptParams);
      const at = now();
      const member = await db.transaction(async (tx) => {
        const memberId = await consumeInvite(tx, req.inviteToken, at);
        if (!memberId) return undefined;
        await setPasswordHash(tx, memberId, passwordHash);
        // A new password (a second invite serves as a reset) ends every session the old one started.
        await endMemberSessions(tx, memberId, at);
        const row = (await findMember(tx, memberId))!;
        const member = { memberId: row.id, accountId: row.account_id, email: row.email };
        await recordActivity(tx, { accountId: member.accountId, kind: "invite_accepted", actor: member.email, at });
        await endPreviousSession(tx, ctx, at);
        await signedIn(ctx, member, at, tx);
        return member;
      });
      if (!member) throw apiError("INVITE_INVALID", "invite_token: this invite is unknown, used or expired; ask for a new one", { field: "invite_token", rule: "a live invite" });
      return { member: memberMessage(member) };
    },

    async signIn(req, ctx) {
      const email = normalizeEmail(req.email);
      throwIfInvalid([
        ...(email === "" || email.length > MAX_EMAIL_CHARS ? [{ field: "email", rule: `required, at most ${MAX_EMAIL_CHARS} characters` }] : []),
        ...(req.password === "" || req.password.length > MAX_PASSWORD_CHARS ? [{ field: "password", rule: `required, at most ${MAX_PASSWORD_CHARS} characters` }] : []),
      ]);
      const retryAfterMs = await countSignInAttempt(db, email, now());
      if (retryAfterMs !== undefined) {
        deps.metrics?.recordSignIn("throttled");
        const seconds = String(Math.ceil(retryAfterMs / 1000));
        ctx.responseHeader.set("retry-after", seconds);
        throw apiError("SIGN_IN_THROTTLED", `too many failed sign-ins for this email: try again in ${seconds} s`, {
          metadata: { retry_after_seconds: seconds, retry_after_ms: String(retryAfterMs) },
        });
      }
      const member = await findMemberByEmail(db, email);
      // An unknown email, or a member who has not set a password yet, costs the same scrypt work as a wrong password.
      const matches = await verifyPassword(req.password, member?.password_hash ?? (await dummyHash), scryptParams);
      const at = now();
      if (!member || member.password_hash === null || !matches) {
        deps.metrics?.recordSignIn("failed");
        if (member) await recordActivity(db, { accountId: member.account_id, kind: "sign_in_failed", actor: member.email, at });
        throw apiError("SIGN_IN_FAILED", "wrong email or password");
      }
      const signedInMember = { memberId: member.id, accountId: member.account_id, email: member.email };
      await db.transaction(async (tx) => {
        await clearSignInAttempts(tx, email);
        await endPreviousSession(tx, ctx, at);
        await signedIn(ctx, signedInMember, at, tx);
        await recordActivity(tx, { accountId: member.account_id, kind: "signed_in", actor: member.email, at });
      });
      deps.metrics?.recordSignIn("ok");
      return { member: memberMessage(signedInMember) };
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
      const member = memberOf(ctx);
      const [money, alerts] = await Promise.all([readAccountMoney(db, member.accountId), readAlertSettings(db, member.accountId)]);
      if (!money) throw apiError("SIGNED_OUT", "not signed in, or the session ended: sign in to the account area");
      return {
        member: memberMessage(member),
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
          balanceLow: alerts !== undefined && (alerts.crossedUnits.length > 0 || alerts.depleted),
        },
      };
    },

    // Until members have roles, every member may change alerts and endpoints.
    async getAlerts(_req, ctx) {
      const member = memberOf(ctx);
      return { alerts: alertsMessage((await readAlertSettings(db, member.accountId))!) };
    },

    async setAlerts(req, ctx) {
      const member = memberOf(ctx);
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
      const member = memberOf(ctx);
      return { endpoints: (await listEndpoints(db, member.accountId)).map(endpointMessage) };
    },

    async addWebhookEndpoint(req, ctx) {
      const member = memberOf(ctx);
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
      const member = memberOf(ctx);
      if (!(await removeEndpoint(db, member.accountId, await ownEndpointId(member.accountId, req.endpointId), { actor: member.email, at: now() }))) throw noSuchEndpoint();
      return {};
    },

    async rotateWebhookSecret(req, ctx) {
      const member = memberOf(ctx);
      const rotated = await rotateSecret(db, member.accountId, await ownEndpointId(member.accountId, req.endpointId), { actor: member.email, at: now() });
      if (!rotated) throw noSuchEndpoint();
      return { endpoint: endpointMessage(rotated.endpoint), secret: rotated.secret };
    },

    async enableWebhookEndpoint(req, ctx) {
      const member = memberOf(ctx);
      const enabled = await enableEndpoint(db, member.accountId, await ownEndpointId(member.accountId, req.endpointId), { actor: member.email, at: now() });
      if (!enabled) throw noSuchEndpoint();
      deps.webhooks.wake();
      return { endpoint: endpointMessage(enabled) };
    },

    async sendTestWebhook(req, ctx) {
      const member = memberOf(ctx);
      const webhookId = await sendTestEvent(db, member.accountId, await ownEndpointId(member.accountId, req.endpointId));
      deps.webhooks.wake();
      return { webhookId };
    },

    async listWebhookDeliveries(req, ctx) {
      const member = memberOf(ctx);
      throwIfInvalid(req.pageSize < 0 || req.pageSize > 100 ? [{ field: "page_size", rule: "0 to 100" }] : []);
      return { deliveries: (await listDeliveries(db, member.accountId, req.pageSize || 20)).map(deliveryMessage) };
    },

    async replayWebhookDelivery(req, ctx) {
      const member = memberOf(ctx);
      if (!(await replayDelivery(db, member.accountId, req.deliveryId, now()))) {
        throw apiError("NOT_FOUND", "delivery_id: no such finished delivery", { field: "delivery_id", rule: "a delivered or failed delivery of your account" });
      }
      deps.webhooks.wake();
      return {};
    },

    async listKeys(_req, ctx) {
      const member = memberOf(ctx);
      return { keys: (await listAccountKeys(db, member.accountId)).map(keyMessage) };
    },

    async createKey(req, ctx) {
      const member = memberOf(ctx);
      const name = req.name.trim();
      throwIfInvalid(
        [...name].length > MAX_KEY_NAME_CHARS || /[\p{Cc}\p{Cf}]/u.test(name)
          ? [{ field: "name", rule: `at most ${MAX_KEY_NAME_CHARS} characters, no control characters` }]
          : [],
      );
      const at = now();
      const { apiKey, row } = await db.transaction(async (tx) => {
        const created = await createApiKey(tx, member.accountId, { name, createdBy: member.email });
        await recordActivity(tx, { accountId: member.accountId, kind: "key_created", actor: member.email, detail: keyLabel(created.row), at });
        return created;
      });
      return { key: keyMessage({ ...row, last_used_at: null }), secret: apiKey };
    },

    async revokeKey(req, ctx) {
      const member = memberOf(ctx);
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
      const member = memberOf(ctx);
      const filter = usageFilter({ endpoint: req.endpoint, since: optionalDate(req.since), until: optionalDate(req.until) });
      const size = pageSize(req.pageSize);
      const after = callCursor(req.pageToken);
      const { calls, more } = await listFinishedCalls(db, member.accountId, filter, { size, after });
      const last = calls.at(-1);
      return {
        records: calls.map((call) => ({
          requestId: call.requestId,
          endpoint: call.endpoint,
          keyId: call.keyId,
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
      const member = memberOf(ctx);
      const granularity = req.granularity === "" ? "day" : req.granularity;
      throwIfInvalid(granularity !== "day" && granularity !== "hour" ? [{ field: "granularity", rule: '"day", "hour" or empty' }] : []);
      const unit = granularity as "day" | "hour";
      const until = optionalDate(req.until) ?? now();
      const since = optionalDate(req.since) ?? new Date(until.getTime() - 30 * DAY_MS);
      throwIfInvalid([
        ...(since.getTime() >= until.getTime() ? [{ field: "since", rule: "must be before until" }] : []),
        ...(until.getTime() - since.getTime() > MAX_SUMMARY_DAYS[unit] * DAY_MS
          ? [{ field: "since", rule: `at most ${MAX_SUMMARY_DAYS[unit]} days before until when counting per ${unit}` }]
          : []),
      ]);
      const buckets = await summarizeCalls(db, member.accountId, { since, until, granularity: unit });
      return {
        buckets: buckets.map((b) => ({ start: timestampFromDate(b.start), endpoint: b.endpoint, calls: b.calls, chargedCredits: unitsToCredits(b.chargedUnits) })),
      };
    },

    async listActivity(req, ctx) {
      const member = memberOf(ctx);
      const size = pageSize(req.pageSize);
      const position = decodePageToken(req.pageToken);
      throwIfInvalid(position && !/^\d+$/.test(position.id) ? [{ field: "page_token", rule: "the next_page_token of an earlier page" }] : []);
      const { rows, more } = await listActivity(db, member.accountId, { size, after: position });
      const last = rows.at(-1);
      return {
        events: rows.map((row: DbActivityRow) => ({ id: row.id, kind: row.kind, actor: row.actor, detail: row.detail, at: timestampFromDate(row.at) })),
        nextPageToken: more && last ? encodePageToken(last.at, last.id) : "",
      };
    },
  };

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

function memberMessage(member: SessionMember): Member {
  return create(MemberSchema, { id: member.memberId, email: member.email, accountId: member.accountId });
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
  });
}

/** How a key is named in the activity log: its prefix, last 4 and name. */
function keyLabel(key: { display_prefix: string; last4: string; name: string }): string {
  return `${key.display_prefix}…${key.last4}${key.name ? ` (${key.name})` : ""}`;
}

function optionalDate(timestamp: Timestamp | undefined): Date | undefined {
  return timestamp ? timestampDate(timestamp) : undefined;
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
