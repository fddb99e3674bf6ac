import { create } from "@bufbuild/protobuf";
import { timestampDate, timestampFromDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { Knex } from "knex";
import { listActivity, recordActivity, type DbActivityRow } from "../accounts/activity.js";
import { KEY_PREFIX } from "../accounts/api-keys.js";
import { consumeInvite, findLiveInvite } from "../accounts/invites.js";
import { findMember, findMemberByEmail, MAX_EMAIL_CHARS, normalizeEmail, setPasswordHash } from "../accounts/members.js";
import type { PasswordWork } from "../accounts/password-work.js";
import { passwordStrengthProblem } from "../accounts/password-strength.js";
import {
  createDummyHash,
  hashPassword,
  MAX_PASSWORD_CHARS,
  passwordLength,
  passwordProblem,
  SCRYPT_PARAMS,
  verifyPassword,
  type ScryptParams,
} from "../accounts/passwords.js";
import { kRemoteAddress } from "../call/context.js";
import { endMemberSessions, endSession, startSession, type SessionMember, type SessionPolicy } from "../accounts/sessions.js";
import { clearSignInAttempts, countSignInAttempt } from "../accounts/sign-in-throttle.js";
import { countLiveKeysLocked, createApiKey, listAccountKeys, revokeAccountKey, type AccountKeyRow } from "../accounts/store.js";
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
import { activityCursor, callCursor, checkedTime, encodePageToken, keyCursor, pageSize, usageFilter } from "./usage-query.js";

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
  /** The one queue every password hash and check waits in. */
  passwordWork: PasswordWork;
  /** Live keys one account may have. */
  maxKeysPerAccount: number;
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
        const member = { memberId: row.id, accountId: row.account_id, email: row.email };
        await recordActivity(tx, { accountId: member.accountId, kind: "invite_accepted", actor: member.email, at });
        await endPreviousSession(tx, ctx, at);
        await signedIn(ctx, member, at, tx);
        return member;
      });
      if (!member) throw inviteInvalid();
      return { member: memberMessage(member) };
    },

    async signIn(req, ctx) {
      const email = normalizeEmail(req.email);
      const chars = passwordLength(req.password);
      throwIfInvalid([
        ...(email === "" || email.length > MAX_EMAIL_CHARS || /[\p{Cc}\p{Cs}]/u.test(email)
          ? [{ field: "email", rule: `required, at most ${MAX_EMAIL_CHARS} characters, no control characters` }]
          : []),
        ...(chars === 0 || chars > MAX_PASSWORD_CHARS ? [{ field: "password", rule: `required, at most ${MAX_PASSWORD_CHARS} characters` }] : []),
      ]);
      // The queue is asked first: a refused attempt is not counted against the email.
      return passwordWork.run(
        clientOf(ctx),
        async () => {
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
        retryAfter(ctx),
      );
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
      const money = await readAccountMoney(db, member.accountId);
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
        },
      };
    },

    async listKeys(req, ctx) {
      const member = memberOf(ctx);
      const size = pageSize(req.pageSize);
      const position = keyCursor(req.pageToken);
      const { keys, more } = await listAccountKeys(db, member.accountId, { size, after: position && { createdAt: position.at, id: position.id } });
      const last = keys.at(-1);
      return { keys: keys.map(keyMessage), nextPageToken: more && last ? encodePageToken(last.created_at, last.id) : "" };
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
        if ((await countLiveKeysLocked(tx, member.accountId)) >= deps.maxKeysPerAccount) {
          throw apiError("KEY_LIMIT_REACHED", `this account has ${deps.maxKeysPerAccount} live keys, the most it may have: revoke one first`, {
            metadata: { max_keys: String(deps.maxKeysPerAccount) },
          });
        }
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
      const filter = usageFilter({ endpoint: req.endpoint, since: optionalDate(req.since, "since"), until: optionalDate(req.until, "until") });
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
      const until = optionalDate(req.until, "until") ?? now();
      const since = optionalDate(req.since, "since") ?? new Date(until.getTime() - 30 * DAY_MS);
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
      const position = activityCursor(req.pageToken);
      const { rows, more } = await listActivity(db, member.accountId, { size, after: position });
      const last = rows.at(-1);
      return {
        events: rows.map((row: DbActivityRow) => ({ id: row.id, kind: row.kind, actor: row.actor, detail: row.detail, at: timestampFromDate(row.at) })),
        nextPageToken: more && last ? encodePageToken(last.at, last.id) : "",
      };
    },
  };

  /** A new session replaces the one the browser had, so two never share a cookie. */
  async function endPreviousSession(tx: Knex.Transaction, ctx: HandlerContext, at: Date): Promise<void> {
    const previous = ctx.values.get(kSessionToken);
    if (previous !== undefined) await endSession(tx, previous, at);
  }
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
    keptBy: key.kept_by ?? "",
    keptAt: key.kept_at ? timestampFromDate(key.kept_at) : undefined,
  });
}

/** How a key is named in the activity log: its prefix, last 4 and name. */
function keyLabel(key: { display_prefix: string; last4: string; name: string }): string {
  return `${key.display_prefix}…${key.last4}${key.name ? ` (${key.name})` : ""}`;
}

/** A request's time, checked: a Timestamp out of range (binary callers can send any seconds) is a 400. */
function optionalDate(timestamp: Timestamp | undefined, field: string): Date | undefined {
  return checkedTime(timestamp ? timestampDate(timestamp) : undefined, field);
}
