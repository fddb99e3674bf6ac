import { parseArgs } from "node:util";
import type { Knex } from "knex";
import { ConfigError } from "../config-error.js";
import { loadConfig } from "../config.js";
import { createKnex, migrate, openDatabase } from "../db/database.js";
import { readPublishedSocket } from "../db/published-socket.js";
import { createApiKey, findAccount, listApiKeys, revokeApiKey, type DbAccountRow } from "../accounts/store.js";
import { createAccount, grant } from "./account-funding.js";
import { createLogger } from "../logger.js";
import { parseCredits, unitsToCredits } from "../units.js";
import { listUsage } from "./usage.js";

const USAGE = `usage: npm run --silent admin -- <command>

  accounts create [--name N] [--credits C] [--free-requests F]
  accounts show --account ID
  keys create --account ID
  keys list --account ID
  keys revoke --key KEY_ID
  credits grant --account ID --credits C
  usage --account ID [--limit N]

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
    const output = await run(store.db, command, values, config.metering.defaultFreeRequests);
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
        limit: { type: "string" },
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

async function run(db: Knex, command: string, options: Options, defaultFreeRequests: number): Promise<unknown> {
  switch (command) {
    case "accounts create": {
      const account = await createAccount(db, {
        name: stringOption(options, "name") ?? "",
        units: credits("credits", stringOption(options, "credits") ?? "0"),
        freeRequests: integerOption(options, "free-requests") ?? defaultFreeRequests,
      });
      const { apiKey, keyId } = await createApiKey(db, account.id);
      return { ...accountJson(account), api_key: apiKey, key_id: keyId };
    }
    case "accounts show":
      return accountJson(await requireAccount(db, requiredOption(options, "account")));
    case "keys create": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const { keyId, apiKey } = await createApiKey(db, account.id);
      return { key_id: keyId, api_key: apiKey, account_id: account.id };
    }
    case "keys list": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      const keys = await listApiKeys(db, account.id);
      return {
        account_id: account.id,
        keys: keys.map((k) => ({ key_id: k.id, prefix: k.display_prefix, created_at: k.created_at, revoked: k.revoked_at !== null })),
      };
    }
    case "keys revoke": {
      const keyId = requiredOption(options, "key");
      if (!(await revokeApiKey(db, keyId))) throw new UsageError(`no key with id ${keyId}`);
      return { revoked: true, key_id: keyId };
    }
    case "credits grant": {
      const accountId = requiredOption(options, "account");
      const units = credits("credits", requiredOption(options, "credits"));
      const account = await grant(db, accountId, units, 0);
      if (!account) throw new UsageError(`no account with id ${accountId}`);
      return accountJson(account);
    }
    case "usage": {
      const account = await requireAccount(db, requiredOption(options, "account"));
      return { account_id: account.id, calls: await listUsage(db, account.id, integerOption(options, "limit") ?? 50) };
    }
    default:
      throw new UsageError(`unknown command "${command}"\n\n${USAGE}`);
  }
}

function accountJson(account: DbAccountRow) {
  return {
    account_id: account.id,
    name: account.name,
    balance_credits: unitsToCredits(account.balance),
    held_credits: unitsToCredits(account.reserved),
    available_credits: unitsToCredits(account.balance - account.reserved),
    free_requests_remaining: account.free_remaining - account.free_reserved,
    free_requests_held: account.free_reserved,
    in_flight: account.in_flight,
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
    await migrate(db, true);
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
