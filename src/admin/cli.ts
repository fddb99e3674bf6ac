import { parseArgs } from "node:util";
import type { Knex } from "knex";
import { ConfigError } from "../config-error.js";
import { loadConfig } from "../config.js";
import { createKnex, migrate, openDatabase } from "../db/database.js";
import { readPublishedSocket } from "../db/published-socket.js";
import { createApiKey, findAccount, isUuid, listApiKeys, revokeApiKey, type DbAccountRow } from "../accounts/store.js";
import { createAccount, grant } from "./account-funding.js";
import { OPERATOR, recordActivity } from "../accounts/activity.js";
import { createInvite } from "../accounts/invites.js";
import { emailProblem, ensureMember, listMembers, markMemberRemoved, normalizeEmail } from "../accounts/members.js";
import { endMemberSessions } from "../accounts/sessions.js";
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

const USAGE = `usage: npm run --silent admin -- <command>

  accounts create [--name N] [--credits C] [--free-requests F]
  accounts show --account ID
  keys create --account ID [--name N]
  keys list --account ID
  keys revoke --key KEY_ID
  credits grant --account ID --credits C
  usage --account ID [--limit N]
  members invite --account ID --email E
  members list --account ID
  members remove --member MEMBER_ID
  alerts show --account ID
  alerts set --account ID --thresholds C[,C...]   (empty: no thresholds)
  webhooks add --account ID --url URL
  webhooks list --account ID
  webhooks remove|rotate|enable|test --account ID --endpoint ENDPOINT_ID
  webhooks deliveries --account ID [--limit N]
  webhooks replay --account ID --delivery DELIVERY_ID

Prints one JSON object on stdout. Credits are decimals (1 credit = 1,000,000 input tokens).`;

/** A mistake in the command line: exit code 2 and the message alone on stderr. */
class UsageError extends Error {}

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
  const config = loadConfig();
  const logger = createLogger("silent");
  const store = await openStore(config.databaseUrl, config.dataDir, logger);
  try {
    const output = await run(store.db, command, values, {
      defaultFreeRequests: config.metering.defaultFreeRequests,
      publicUrl: config.account.publicUrl,
      publicUrlIsGuessed: config.account.publicUrlIsGuessed,
      allowLoopbackWebhooks: config.webhooks.allowLoopback,
    });
    process.stdout.write(JSON.stringify(output) + "\n");
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
        limit: { type: "string" },
        thresholds: { type: "string" },
        url: { type: "string" },
        endpoint: { type: "string" },
        delivery: { type: "string" },
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

/** Where invite links point: the account page reads the token from its query. */
export const INVITE_PATH = "/account/?invite=";

async function run(
  db: Knex,
  command: string,
  options: Options,
  settings: { defaultFreeRequests: number; publicUrl: string; publicUrlIsGuessed: boolean; allowLoopbackWebhooks: boolean },
): Promise<unknown> {
  const now = new Date();
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
      const { keyId, apiKey, row } = await db.transaction(async (tx) => {
        const created = await createApiKey(tx, account.id, { name, createdBy: OPERATOR });
        await recordActivity(tx, { accountId: account.id, kind: "key_created", actor: OPERATOR, detail: `${created.row.display_prefix}…${created.row.last4}`, at: now });
        return created;
      });
      return { key_id: keyId, api_key: apiKey, account_id: account.id, name: row.name };
    }
    case "keys list": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const keys = await listApiKeys(db, account.id);
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
    case "members invite": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const email = normalizeEmail(requiredOption(options, "email"));
      const problem = emailProblem(email);
      if (problem) throw new UsageError(`--email must be ${problem}, got "${email}"`);
      const invited = await db.transaction(async (tx) => {
        const member = await ensureMember(tx, account.id, email);
        if (!member) return undefined;
        const invite = await createInvite(tx, member.id, now);
        await recordActivity(tx, { accountId: account.id, kind: "member_invited", actor: OPERATOR, detail: email, at: now });
        return { member, invite };
      });
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
        invite_url: `${settings.publicUrl}${INVITE_PATH}${invited.invite.token}`,
        invite_token: invited.invite.token,
        expires_at: invited.invite.expiresAt.toISOString(),
      };
    }
    case "members list": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const members = await listMembers(db, account.id);
      return {
        account_id: account.id,
        members: members.map((m) => ({ member_id: m.id, email: m.email, created_at: m.created_at, invite_accepted: m.password_hash !== null })),
      };
    }
    case "members remove": {
      const memberId = requiredOption(options, "member");
      const removed = await db.transaction(async (tx) => {
        const member = await markMemberRemoved(tx, memberId, now);
        if (!member) return undefined;
        // Their sessions end in the same transaction: no call is served for them after this commits.
        const sessionsEnded = await endMemberSessions(tx, member.id, now);
        await tx("member_invites").where({ member_id: member.id }).whereNull("used_at").update({ used_at: now });
        await recordActivity(tx, { accountId: member.account_id, kind: "member_removed", actor: OPERATOR, detail: member.email, at: now });
        return { member, sessionsEnded };
      });
      if (!removed) throw new UsageError(`no member with id ${memberId}`);
      return { removed: true, member_id: removed.member.id, account_id: removed.member.account_id, email: removed.member.email, sessions_ended: removed.sessionsEnded };
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

async function openStore(databaseUrl: string | undefined, dataDir: string, logger: ReturnType<typeof createLogger>) {
  if (databaseUrl) {
    const db = createKnex(databaseUrl, 2);
    await migrate(db, { useAdvisoryLock: true });
    return { db, close: () => db.destroy() };
  }
  const running = await readPublishedSocket(dataDir);
  if (running) {
    const db = createKnex(running.url, 1);
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
