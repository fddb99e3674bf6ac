import { parseArgs } from "node:util";
import type { Knex } from "knex";
import { ConfigError } from "../config-error.js";
import { loadConfig } from "../config.js";
import { createKnex, migrate, openDatabase } from "../db/database.js";
import { readPublishedSocket } from "../db/published-socket.js";
import { createApiKey, findAccountKey, listAccountKeys, listApiKeys, revokeApiKey, type AccountKeyRow } from "../keys/store.js";
import { findAccount, type DbAccountRow } from "./account-funding.js";
import { isUuid } from "../validation.js";
import { changeKeyLimits, keyLimitsOf, MAX_ROLL_GRACE_SECONDS, parseKeyLimits, rollKey, setKeyLimits, type KeyLimits } from "../keys/key-limits.js";
import { createAccount, grant } from "./account-funding.js";
import { listActivity, OPERATOR, recordActivity } from "../team/activity.js";
import { createInvite, inviteUrl } from "../team/invites.js";
import { emailProblem, ensureMember, findMember, findMemberByEmail, listMembers, normalizeEmail } from "../team/members.js";
import { isRole, ROLES, type Role } from "../team/roles.js";
import { changeMemberRole, hasOwner, LAST_OWNER_RULE, removeTeamMember } from "../team/team.js";
import type { RemovedMemberKey } from "../team/member-removal.js";
import { disableTotp } from "../sign-in/two-factor.js";
import { readAccountMoney, type AccountMoney } from "../metering/account-views.js";
import { createLogger } from "../logger.js";
import { parseCredits, unitsToCredits } from "../units.js";
import { listUsage } from "./usage.js";
import { DECISION_RESERVE_UNITS_PER_QUESTION } from "../metering/meter.js";
import { listDeliveries, replayDelivery, sendTestEvent } from "../webhooks/deliveries.js";
import { addEndpoint, enableEndpoint, findEndpoint, listEndpoints, MAX_ENDPOINTS, removeEndpoint, rotateSecret } from "../webhooks/endpoints.js";
import { endpointUrlViolations } from "../webhooks/endpoint-url.js";
import { readAlertSettings, setAlertSettings, type AlertSettings } from "../webhooks/events.js";
import { thresholdViolations } from "../webhooks/thresholds.js";
import { runEvals } from "./evals.js";
import { UsageError } from "./usage-error.js";
import { REQUIRED_OPTIONS, USAGE } from "./commands.js";

/** A command line that no store could make right: an unknown command, or a required option left out. */
function refuseBeforeStore(command: string, options: Options): void {
  const required = REQUIRED_OPTIONS[command];
  if (!required) {
    throw new UsageError(command.startsWith("evals ") ? `unknown command "${command}": see --help` : `unknown command "${command}"\n\n${USAGE}`);
  }
  for (const name of required) requiredOption(options, name);
}

/** The largest count the integer columns behind --free-requests and --limit hold. */
const MAX_INTEGER_OPTION = 2_147_483_647;

/**
 * The operator CLI. It reaches the same store as the service: DATABASE_URL,
 * else the embedded store of a running service through its published socket,
 * else the embedded store opened directly.
 */
async function main(argv: string[]): Promise<number> {
  const { values, positionals } = parseCommandLine(argv);
  const command = positionals.join(" ");
  if (values.help || command === "") {
    process.stdout.write(USAGE + "\n");
    return values.help ? 0 : 2;
  }
  refuseBeforeStore(command, values);
  const config = loadConfig();
  const logger = createLogger("silent");
  const store = await openStore(config.databaseUrl, config.dataDir, logger);
  try {
    const output = await run(store.db, command, values, {
      defaultFreeRequests: config.metering.defaultFreeRequests,
      publicUrl: config.account.publicUrl,
      publicUrlIsGuessed: !config.account.publicUrlConfigured,
      allowLoopbackWebhooks: config.webhooks.allowLoopback,
    });
    process.stdout.write(typeof output === "string" ? output : JSON.stringify(output) + "\n");
    return 0;
  } finally {
    await store.close();
  }
}

type Options = Record<string, string | boolean | undefined>;

/**
 * util.parseArgs, with its errors (unknown option, missing or ambiguous value
 * such as `--credits -1`) turned into usage errors. Its messages already name
 * the option and say how to pass a value that starts with "-".
 */
function parseCommandLine(argv: string[]) {
  try {
    return parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        name: { type: "string" },
        credits: { type: "string" },
        "free-requests": { type: "string" },
        account: { type: "string" },
        key: { type: "string" },
        email: { type: "string" },
        member: { type: "string" },
        role: { type: "string" },
        limit: { type: "string" },
        "expires-at": { type: "string" },
        scopes: { type: "string" },
        budget: { type: "string" },
        "budget-period": { type: "string" },
        rate: { type: "string" },
        "grace-seconds": { type: "string" },
        "keep-keys": { type: "boolean" },
        thresholds: { type: "string" },
        url: { type: "string" },
        endpoint: { type: "string" },
        delivery: { type: "string" },
        questions: { type: "string" },
        file: { type: "string" },
        cap: { type: "string" },
        "in-flight": { type: "string" },
        evaluation: { type: "string" },
        csv: { type: "boolean" },
        help: { type: "boolean", short: "h" },
      },
    });
  } catch (err) {
    if (isParseArgsError(err)) throw new UsageError(`${err.message}\n\n${USAGE}`);
    throw err;
  }
}

function isParseArgsError(err: unknown): err is Error {
  const code = (err as { code?: unknown } | null)?.code;
  return err instanceof Error && typeof code === "string" && code.startsWith("ERR_PARSE_ARGS_");
}

async function run(
  db: Knex,
  command: string,
  options: Options,
  settings: { defaultFreeRequests: number; publicUrl: string; publicUrlIsGuessed: boolean; allowLoopbackWebhooks: boolean },
): Promise<unknown> {
  const now = new Date();
  if (command.startsWith("evals ")) return runEvals(db, command, options, now);
  switch (command) {
    case "accounts create": {
      const account = await createAccount(db, {
        name: stringOption(options, "name") ?? "",
        units: credits("credits", stringOption(options, "credits") ?? "0"),
        freeRequests: integerOption(options, "free-requests") ?? settings.defaultFreeRequests,
      });
      const { apiKey, keyId } = await createApiKey(db, account.id);
      return { ...moneyJson((await readAccountMoney(db, account.id))!), api_key: apiKey, key_id: keyId };
    }
    case "accounts show": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      return moneyJson((await readAccountMoney(db, account.id))!);
    }
    case "keys create": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const name = stringOption(options, "name") ?? "";
      const limits = await limitsOption(db, account.id, options, now);
      const { keyId, apiKey, row } = await db.transaction(async (tx) => {
        const created = await createApiKey(tx, account.id, { name, createdBy: OPERATOR });
        await setKeyLimits(tx, account.id, created.keyId, limits);
        await recordActivity(tx, { accountId: account.id, kind: "key_created", actor: OPERATOR, detail: `${created.row.display_prefix}…${created.row.last4}`, at: now });
        return created;
      });
      return { key_id: keyId, api_key: apiKey, account_id: account.id, name: row.name, ...(await keyJson(db, account.id, keyId)) };
    }
    case "keys update": {
      const keyId = requiredOption(options, "key");
      const key = isUuid(keyId) ? await db("api_keys").where({ id: keyId }).first("account_id") : undefined;
      if (!key) throw new UsageError(`no key with id ${keyId}`);
      const limits = await limitsOption(db, key.account_id, options, now);
      const updated = await db.transaction((tx) => changeKeyLimits(tx, key.account_id, keyId, limits, { actor: OPERATOR, at: now }));
      if (!updated) throw new UsageError(`key ${keyId} is revoked`);
      return { key_id: keyId, account_id: key.account_id, ...(await keyJson(db, key.account_id, keyId)) };
    }
    case "keys roll": {
      const keyId = requiredOption(options, "key");
      const graceSeconds = integerOption(options, "grace-seconds") ?? 0;
      if (graceSeconds > MAX_ROLL_GRACE_SECONDS) throw new UsageError(`--grace-seconds must be from 0 to ${MAX_ROLL_GRACE_SECONDS} (7 days), got ${graceSeconds}`);
      const key = isUuid(keyId) ? await db("api_keys").where({ id: keyId }).first("account_id") : undefined;
      const rolled = key && (await db.transaction(async (tx) => {
        const result = await rollKey(tx, key.account_id, keyId, { graceSeconds, now, createdBy: OPERATOR });
        if (result) {
          const detail = `${result.newKey.display_prefix}…${result.newKey.last4}, rolled from ${result.oldKey.display_prefix}…${result.oldKey.last4}`;
          await recordActivity(tx, { accountId: key.account_id, kind: "key_rolled", actor: OPERATOR, detail, at: now });
        }
        return result;
      }));
      if (!rolled) throw new UsageError(`no key with id ${keyId} that still works`);
      return {
        key_id: rolled.newKeyId,
        api_key: rolled.apiKey,
        account_id: key.account_id,
        ...(await keyJson(db, key.account_id, rolled.newKeyId)),
        old_key: { key_id: keyId, ...(await keyJson(db, key.account_id, keyId)) },
      };
    }
    case "keys list": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const keys = await listApiKeys(db, account.id);
      // The operator sees every key at once: one page as large as the account may hold.
      const withLimits = new Map((await listAccountKeys(db, account.id, { size: keys.length + 1 })).keys.map((k) => [k.id, k]));
      return {
        account_id: account.id,
        keys: keys.map((k) => ({
          key_id: k.id,
          prefix: k.display_prefix,
          name: k.name,
          last4: k.last4,
          created_by: k.created_by,
          created_at: k.created_at,
          revoked: k.revoked_at !== null,
          ...limitsJson(withLimits.get(k.id)!),
        })),
      };
    }
    case "keys revoke": {
      const keyId = requiredOption(options, "key");
      const revoked = await db.transaction(async (tx) => {
        const key = isUuid(keyId) ? await tx("api_keys").where({ id: keyId }).first("account_id", "display_prefix", "last4", "revoked_at") : undefined;
        if (!key || !(await revokeApiKey(tx, keyId))) return false;
        if (key.revoked_at === null) {
          await recordActivity(tx, { accountId: key.account_id, kind: "key_revoked", actor: OPERATOR, detail: `${key.display_prefix}…${key.last4}`, at: now });
        }
        return true;
      });
      if (!revoked) throw new UsageError(`no key with id ${keyId}`);
      return { revoked: true, key_id: keyId };
    }
    case "credits grant": {
      const accountId = requiredOption(options, "account");
      const units = credits("credits", requiredOption(options, "credits"));
      const account = await db.transaction(async (tx) => {
        const granted = await grant(tx, accountId, units, 0);
        if (granted) await recordActivity(tx, { accountId, kind: "credits_granted", actor: OPERATOR, detail: `${unitsToCredits(units)} credits`, at: now });
        return granted;
      });
      if (!account) throw new UsageError(`no account with id ${accountId}`);
      return moneyJson((await readAccountMoney(db, accountId))!);
    }
    case "usage": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      return { account_id: account.id, calls: await listUsage(db, account.id, integerOption(options, "limit") ?? 50) };
    }
    case "activity": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const { rows } = await listActivity(db, account.id, { size: Math.min(integerOption(options, "limit") ?? 50, 500) });
      return { account_id: account.id, events: rows.map((r) => ({ id: r.id, at: r.at, actor: r.actor, kind: r.kind, detail: r.detail })) };
    }
    case "members invite": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const email = normalizeEmail(requiredOption(options, "email"));
      const problem = emailProblem(email);
      if (problem) throw new UsageError(`--email must be ${problem}, got "${email}"`);
      const role = roleOption(options);
      // Inviting a member again is the operator's password reset; their role changes only when --role says so.
      const invited = await db.transaction(async (tx) => {
        const existing = await findMemberByEmail(tx, email);
        // An account's first member is its owner unless --role says otherwise: someone must be able to invite the rest.
        const newRole = role ?? (existing ? undefined : (await hasOwner(tx, account.id)) ? "member" : "owner");
        const member = await ensureMember(tx, account.id, email, newRole);
        if (!member) return undefined;
        let current = member;
        if (existing && role && role !== existing.role) {
          const changed = await changeMemberRole(tx, account.id, member.id, role);
          if (changed === "last_owner" || changed === undefined) return "last_owner" as const;
          current = changed.member;
          await recordActivity(tx, { accountId: account.id, kind: "member_role_changed", actor: OPERATOR, detail: `${email}: ${changed.previous} to ${role}`, at: now });
        }
        const invite = await createInvite(tx, member.id, now);
        await recordActivity(tx, { accountId: account.id, kind: "member_invited", actor: OPERATOR, detail: `${email} as ${current.role}`, at: now });
        return { member: current, invite };
      });
      if (invited === "last_owner") throw new UsageError(`${LAST_OWNER_RULE}: make another member owner first (members role)`);
      if (!invited) throw new UsageError(`${email} is already a member of another account; remove them there first`);
      if (settings.publicUrlIsGuessed) {
        // The service's address is its own setting; this process only knows its own HOST and PORT.
        process.stderr.write(
          `note: the invite link assumes the service is at ${settings.publicUrl} (this command's HOST and PORT); ` +
            `give this command the service's TYPESAFE_PUBLIC_URL when it differs\n`,
        );
      }
      return {
        member_id: invited.member.id,
        account_id: account.id,
        email,
        role: invited.member.role,
        invite_url: inviteUrl(settings.publicUrl, invited.invite.token),
        invite_token: invited.invite.token,
        expires_at: invited.invite.expiresAt.toISOString(),
      };
    }
    case "members list": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const members = await listMembers(db, account.id);
      return {
        account_id: account.id,
        members: members.map((m) => ({
          member_id: m.id,
          email: m.email,
          role: m.role,
          created_at: m.created_at,
          invite_accepted: m.password_hash !== null,
          two_factor_enabled: m.totp_enabled_at !== null,
        })),
      };
    }
    case "members role": {
      const memberId = requiredOption(options, "member");
      const role = roleOption(options);
      if (!role) throw new UsageError(`--role is required: one of ${ROLES.join(", ")}`);
      const changed = await db.transaction(async (tx) => {
        const member = await findMember(tx, memberId);
        if (!member) return undefined;
        const outcome = await changeMemberRole(tx, member.account_id, member.id, role);
        if (outcome === "last_owner" || outcome === undefined) return outcome;
        if (outcome.previous !== role) {
          await recordActivity(tx, { accountId: member.account_id, kind: "member_role_changed", actor: OPERATOR, detail: `${member.email}: ${outcome.previous} to ${role}`, at: now });
        }
        return outcome;
      });
      if (changed === "last_owner") throw new UsageError(`${LAST_OWNER_RULE}: make another member owner first`);
      if (!changed) throw new UsageError(`no member with id ${memberId}`);
      return { member_id: changed.member.id, account_id: changed.member.account_id, email: changed.member.email, role: changed.member.role, previous_role: changed.previous };
    }
    case "members remove": {
      const memberId = requiredOption(options, "member");
      const keepKeys = options["keep-keys"] === true;
      // One transaction: no call is served for the member, nor with their revoked keys, after it commits.
      const removed = await db.transaction((tx) => removeTeamMember(tx, { memberId, actor: OPERATOR, keepKeys, now }));
      if (removed === "last_owner") throw new UsageError(`${LAST_OWNER_RULE}: make another member owner first (members role)`);
      if (!removed) throw new UsageError(`no member with id ${memberId}`);
      const keyJson = (k: RemovedMemberKey) => ({ key_id: k.id, name: k.name, prefix: k.display_prefix, last4: k.last4 });
      return {
        removed: true,
        member_id: removed.member.id,
        account_id: removed.member.account_id,
        email: removed.member.email,
        sessions_ended: removed.sessionsEnded,
        keys_revoked: removed.keysRevoked.map(keyJson),
        keys_kept: removed.keysKept.map(keyJson),
      };
    }
    case "members reset-two-factor": {
      // For a member who lost both their authenticator and their recovery codes.
      const memberId = requiredOption(options, "member");
      const member = await db.transaction(async (tx) => {
        const row = await findMember(tx, memberId);
        if (!row) return undefined;
        await disableTotp(tx, row.id, now);
        await recordActivity(tx, { accountId: row.account_id, kind: "two_factor_disabled", actor: OPERATOR, detail: row.email, at: now });
        return row;
      });
      if (!member) throw new UsageError(`no member with id ${memberId}`);
      return { member_id: member.id, account_id: member.account_id, email: member.email, two_factor_enabled: false };
    }
    case "alerts show": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      return alertsJson(account.id, (await readAlertSettings(db, account.id))!);
    }
    case "alerts set": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const raw = stringOption(options, "thresholds");
      if (raw === undefined) throw new UsageError("--thresholds is required (an empty value removes every threshold)");
      const parts = raw.trim() === "" ? [] : raw.split(",").map((part) => credits("thresholds", part));
      const { units, violations } = thresholdViolations("thresholds", parts.map(unitsToCredits));
      if (violations[0]) throw new UsageError(`--${violations[0].field}: ${violations[0].rule}`);
      const settings = await db.transaction(async (tx) => {
        const set = await setAlertSettings(tx, account.id, units, DECISION_RESERVE_UNITS_PER_QUESTION);
        await recordActivity(tx, { accountId: account.id, kind: "alerts_set", actor: OPERATOR, detail: raw, at: now });
        return set!;
      });
      return alertsJson(account.id, settings);
    }
    case "webhooks add": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const url = requiredOption(options, "url").trim();
      const violation = endpointUrlViolations("url", url, settings.allowLoopbackWebhooks)[0];
      if (violation) throw new UsageError(`--url ${violation.rule}`);
      const added = await addEndpoint(db, account.id, url, { actor: OPERATOR, at: now });
      if (!added) throw new UsageError(`the account has ${MAX_ENDPOINTS} endpoints already`);
      const alerts = await readAlertSettings(db, account.id);
      if (alerts?.depletionFloorUnits === undefined) await setAlertSettings(db, account.id, alerts?.thresholdsUnits ?? [], DECISION_RESERVE_UNITS_PER_QUESTION);
      return { account_id: account.id, endpoint_id: added.endpoint.id, url, secret: added.secret };
    }
    case "webhooks list": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const endpoints = await listEndpoints(db, account.id);
      return {
        account_id: account.id,
        endpoints: endpoints.map((e) => ({ endpoint_id: e.id, url: e.url, enabled: e.enabled, disabled_reason: e.disabledReason, created_at: e.createdAt })),
      };
    }
    case "webhooks remove":
    case "webhooks rotate":
    case "webhooks enable":
    case "webhooks test": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const endpointId = requiredOption(options, "endpoint");
      if (!isUuid(endpointId) || !(await findEndpoint(db, account.id, endpointId))) throw new UsageError(`no endpoint with id ${endpointId} in this account`);
      const change = { actor: OPERATOR, at: now };
      if (command === "webhooks remove") return { removed: await removeEndpoint(db, account.id, endpointId, change), endpoint_id: endpointId };
      if (command === "webhooks rotate") return { endpoint_id: endpointId, secret: (await rotateSecret(db, account.id, endpointId, change))!.secret };
      if (command === "webhooks enable") return { endpoint_id: endpointId, enabled: (await enableEndpoint(db, account.id, endpointId, change))!.enabled };
      return { endpoint_id: endpointId, webhook_id: await sendTestEvent(db, account.id, endpointId) };
    }
    case "webhooks deliveries": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const deliveries = await listDeliveries(db, account.id, Math.min(integerOption(options, "limit") ?? 20, 500));
      return { account_id: account.id, deliveries };
    }
    case "webhooks replay": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const deliveryId = requiredOption(options, "delivery");
      if (!(await replayDelivery(db, account.id, deliveryId, now))) throw new UsageError(`no finished delivery with id ${deliveryId} in this account`);
      return { replayed: true, delivery_id: deliveryId };
    }
    default:
      throw new UsageError(`unknown command "${command}"\n\n${USAGE}`);
  }
}

/** The --role option, when given: one of the roles. */
function roleOption(options: Options): Role | undefined {
  const role = stringOption(options, "role");
  if (role === undefined) return undefined;
  if (!isRole(role)) throw new UsageError(`--role must be one of ${ROLES.join(", ")}, got "${role}"`);
  return role;
}

/** An account as every command prints it: the account area's view (metering's), with the operator's names. */
function moneyJson(money: AccountMoney) {
  return {
    account_id: money.id,
    name: money.name,
    balance_credits: unitsToCredits(money.balanceUnits),
    held_credits: unitsToCredits(money.heldUnits),
    available_credits: unitsToCredits(money.availableUnits),
    free_requests_remaining: money.freeAvailable,
    free_requests_held: money.freeHeld,
    in_flight: money.inFlight,
    max_in_flight: money.maxInFlight,
    requests_per_minute: money.requestsPerMinute,
  };
}

function alertsJson(accountId: string, settings: AlertSettings) {
  return {
    account_id: accountId,
    thresholds_credits: settings.thresholdsUnits.map(unitsToCredits),
    crossed_credits: settings.crossedUnits.map(unitsToCredits),
    depleted: settings.depleted,
  };
}

async function requireAccount(db: Knex, accountId: string): Promise<DbAccountRow> {
  const account = await findAccount(db, accountId);
  if (!account) throw new UsageError(`no account with id ${accountId}`);
  return account;
}

function stringOption(options: Options, name: string): string | undefined {
  const value = options[name];
  return typeof value === "string" ? value : undefined;
}

function requiredOption(options: Options, name: string): string {
  const value = stringOption(options, name);
  if (!value) throw new UsageError(`--${name} is required`);
  return value;
}

function integerOption(options: Options, name: string): number | undefined {
  const value = stringOption(options, name);
  if (value === undefined) return undefined;
  if (!/^\d+$/.test(value) || Number(value) > MAX_INTEGER_OPTION) {
    throw new UsageError(`--${name} must be a whole number from 0 to ${MAX_INTEGER_OPTION}, got "${value}"`);
  }
  return Number(value);
}

/** A credit amount in units; a malformed or too large one is a usage error naming the option. */
function credits(name: string, value: string): number {
  try {
    return parseCredits(value);
  } catch (err) {
    throw new UsageError(`--${name}: ${err instanceof Error ? err.message : String(err)}`);
  }
}

/** The key-limit options as KeyLimits, checked as the account area checks them; a broken rule names its option. */
async function limitsOption(db: Knex, accountId: string, options: Options, now: Date): Promise<KeyLimits> {
  const expires = stringOption(options, "expires-at");
  const expiresAt = expires === undefined ? undefined : new Date(expires);
  if (expiresAt && Number.isNaN(expiresAt.getTime())) throw new UsageError(`--expires-at must be an ISO 8601 time, got "${expires}"`);
  const budget = stringOption(options, "budget");
  const rate = integerOption(options, "rate") ?? 0;
  if (rate === 0 && options["rate"] !== undefined) throw new UsageError("--rate must be from 1 to the account's calls per minute");
  const money = await readAccountMoney(db, accountId);
  const parsed = parseKeyLimits(
    {
      expiresAt,
      scopes: stringOption(options, "scopes")?.split(",").map((scope) => scope.trim()) ?? [],
      budgetCredits: budget === undefined ? undefined : unitsToCredits(credits("budget", budget)),
      budgetPeriod: stringOption(options, "budget-period") ?? "",
      rateLimit: rate,
    },
    { now, accountRateLimit: money?.requestsPerMinute ?? 0, fieldPath: "limits" },
  );
  const violation = parsed.violations[0];
  if (violation) throw new UsageError(`${LIMIT_OPTIONS[violation.field] ?? violation.field}: ${violation.rule}`);
  return (parsed as { limits: KeyLimits }).limits;
}

/** The option behind each field of a key's limits. */
const LIMIT_OPTIONS: Record<string, string> = {
  "limits.expires_at": "--expires-at",
  "limits.scopes": "--scopes",
  "limits.budget_credits": "--budget",
  "limits.budget_period": "--budget-period",
  "limits.requests_per_minute": "--rate",
};

async function keyJson(db: Knex, accountId: string, keyId: string) {
  const key = (await findAccountKey(db, accountId, keyId))!;
  return limitsJson(key);
}

/** A key's limits and its budget this period, as the account area shows them, in the CLI's snake_case. */
function limitsJson(key: AccountKeyRow) {
  const limits = keyLimitsOf(key);
  return {
    expires_at: limits.expiresAt,
    scopes: limits.scopes,
    budget_credits: limits.budget ? unitsToCredits(limits.budget.units) : null,
    budget_period: limits.budget?.period ?? null,
    requests_per_minute: limits.rateLimit,
    budget_spent_credits: limits.budget ? unitsToCredits(Number(key.spent_units)) : null,
    budget_held_credits: limits.budget ? unitsToCredits(Number(key.held_units)) : null,
  };
}

async function openStore(databaseUrl: string | undefined, dataDir: string, logger: ReturnType<typeof createLogger>) {
  if (databaseUrl) {
    const db = createKnex(databaseUrl, 2);
    await migrate(db, { useAdvisoryLock: true });
    return { db, close: () => db.destroy() };
  }
  const running = await readPublishedSocket(dataDir);
  if (running) {
    const db = createKnex(running.url, 1, undefined, "any");
    return { db, close: () => db.destroy() };
  }
  return openDatabase({ databaseUrl: undefined, dataDir, logger });
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    const known = err instanceof UsageError || err instanceof ConfigError;
    process.stderr.write(`admin: ${known && err instanceof Error ? err.message : `failed: ${err instanceof Error ? err.message : String(err)}`}\n`);
    process.exit(known ? 2 : 1);
  },
);
