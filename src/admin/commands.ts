/** The operator CLI's commands: its usage text, and what each command cannot run without. */

/** What `--help` prints; every command in it is a key of REQUIRED_OPTIONS (test/admin/commands.test.ts). */
export const USAGE = `usage: npm run --silent admin -- <command>

  accounts create [--name N] [--credits C] [--free-requests F]
  accounts show --account ID
  keys create --account ID [--name N] [LIMITS]
  keys update --key KEY_ID [LIMITS]        (the key's limits, in full: one left out is removed)
  keys roll --key KEY_ID [--grace-seconds S]   (old key stops in S seconds, 0 to 604800; default 0)
  keys list --account ID
  keys revoke --key KEY_ID
  credits grant --account ID --credits C
  usage --account ID [--limit N]
  activity --account ID [--limit N]       (newest first, at most 500)
  members invite --account ID --email E [--role owner|admin|member|viewer]
  members list --account ID
  members role --member MEMBER_ID --role owner|admin|member|viewer
  members remove --member MEMBER_ID [--keep-keys]
  members reset-two-factor --member MEMBER_ID
  alerts show --account ID
  alerts set --account ID --thresholds C[,C...]   (empty: no thresholds)
  webhooks add --account ID --url URL
  webhooks list --account ID
  webhooks remove|rotate|enable|test --account ID --endpoint ENDPOINT_ID
  webhooks deliveries --account ID [--limit N]
  webhooks replay --account ID --delivery DELIVERY_ID
  evals create --account ID --questions FILE.json --file EXAMPLES.jsonl|.csv --cap C [--in-flight N] [--name N]
  evals show --evaluation EVALUATION_ID       (or --account ID: the account's evaluations)
  evals results --evaluation EVALUATION_ID [--csv]
  evals cancel|resume|delete --evaluation EVALUATION_ID

LIMITS: [--expires-at ISO-8601] [--scopes decisions,search] [--budget C --budget-period day|week|month|total]
        [--rate CALLS_PER_MINUTE]

Prints one JSON object on stdout. Credits are decimals (1 credit = 1,000,000 input tokens).`;

/**
 * Every command and the options it cannot run without, in the order it asks
 * for them: a command line missing one is refused before the store is opened.
 */
export const REQUIRED_OPTIONS: Record<string, readonly string[]> = {
  "accounts create": [],
  "accounts show": ["account"],
  "keys create": ["account"],
  "keys update": ["key"],
  "keys roll": ["key"],
  "keys list": ["account"],
  "keys revoke": ["key"],
  "credits grant": ["account", "credits"],
  usage: ["account"],
  activity: ["account"],
  "members invite": ["account", "email"],
  "members list": ["account"],
  "members role": ["member"],
  "members remove": ["member"],
  "members reset-two-factor": ["member"],
  "alerts show": ["account"],
  "alerts set": ["account"],
  "webhooks add": ["account", "url"],
  "webhooks list": ["account"],
  "webhooks remove": ["account", "endpoint"],
  "webhooks rotate": ["account", "endpoint"],
  "webhooks enable": ["account", "endpoint"],
  "webhooks test": ["account", "endpoint"],
  "webhooks deliveries": ["account"],
  "webhooks replay": ["account", "delivery"],
  "evals create": ["account"],
  // --evaluation, or --account for the account's list.
  "evals show": [],
  "evals results": ["evaluation"],
  "evals cancel": ["evaluation"],
  "evals resume": ["evaluation"],
  "evals delete": ["evaluation"],
};
