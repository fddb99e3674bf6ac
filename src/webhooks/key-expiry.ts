import type { Knex } from "knex";
import type { Logger } from "../logger.js";

/** How long before its expiry a key's `key.expiring` is recorded. */
export const KEY_EXPIRY_NOTICE_MS = 7 * 86_400_000;

/** Keys warned per statement: a bounded transaction, the rest at the next statement. */
const BATCH = 500;

/**
 * Records `key.expiring` for every live key that expires within the notice
 * and has not been warned of this expiry, each with its deliveries, in one
 * statement: the UPDATE that marks the key and the event's insert commit
 * together. Replicas running it at once never warn a key twice: a row taken
 * by one is skipped by the others, and a row marked since their snapshot no
 * longer matches when they lock it. A key whose expiry changes is warned
 * again; a key already expired or revoked is not. Returns the events recorded.
 */
export async function recordExpiringKeys(db: Knex | Knex.Transaction, now: Date): Promise<number> {
  let recorded = 0;
  for (;;) {
    const { rows } = await db.raw<{ rows: unknown[] }>(
      `WITH due AS (
         SELECT k.id FROM api_keys k
          WHERE k.expires_at IS NOT NULL AND k.revoked_at IS NULL
            AND k.expires_at > ? AND k.expires_at <= ?
            AND k.expiry_warned_for IS DISTINCT FROM k.expires_at
          ORDER BY k.expires_at
          LIMIT ${BATCH}
          FOR UPDATE SKIP LOCKED),
       warned AS (
         UPDATE api_keys k SET expiry_warned_for = k.expires_at FROM due WHERE k.id = due.id
         RETURNING k.id, k.account_id, k.name, k.display_prefix, k.last4, k.expires_at)
       SELECT account_event_record_v1(w.account_id, 'key.expiring', jsonb_build_object(
                'key_id', w.id, 'key_name', w.name, 'key_prefix', w.display_prefix, 'key_last4', w.last4,
                'expires_at', to_char(w.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')))
         FROM (SELECT * FROM warned ORDER BY expires_at, id) w`,
      [now, new Date(now.getTime() + KEY_EXPIRY_NOTICE_MS)],
    );
    recorded += rows.length;
    if (rows.length < BATCH) return recorded;
  }
}

/** The periodic `key.expiring` check of one replica. */
export interface KeyExpiryWatch {
  /** Starts the checks; a second start does nothing. */
  start(): void;
  /** Stops the checks and waits for one in progress. */
  stop(): Promise<void>;
}

/**
 * Runs `recordExpiringKeys` every `intervalMs`, skipped while the previous
 * check still runs; `onRecorded` hears when events were recorded (to wake the
 * deliverer). Its timer does not keep the process alive; a failed check is
 * logged and tried again at the next tick.
 */
export function createKeyExpiryWatch(deps: {
  db: Knex;
  intervalMs: number;
  now: () => Date;
  logger: Logger;
  onRecorded: () => void;
}): KeyExpiryWatch {
  let timer: NodeJS.Timeout | undefined;
  let checking: Promise<void> | undefined;
  return {
    start() {
      if (timer) return;
      timer = setInterval(() => {
        if (checking) return;
        checking = recordExpiringKeys(deps.db, deps.now())
          .then(
            (count) => {
              if (count > 0) deps.onRecorded();
            },
            (err: unknown) => deps.logger.warn("key expiry check failed", { error: err instanceof Error ? err.message : String(err) }),
          )
          .finally(() => {
            checking = undefined;
          });
      }, deps.intervalMs);
      timer.unref();
    },
    async stop() {
      if (timer) clearInterval(timer);
      timer = undefined;
      await checking;
    },
  };
}
