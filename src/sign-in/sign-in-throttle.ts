import type { Knex } from "knex";

/** Failed sign-ins allowed for one email within the window before every attempt is refused. */
export const MAX_FAILED_SIGN_INS = 5;
/** The window the failures are counted in. */
export const SIGN_IN_WINDOW_MS = 15 * 60_000;

/** Out-of-window rows each attempt deletes: more than it adds, so the table shrinks back after a burst. */
const STALE_ROWS_DROPPED = 10;

/**
 * Counts a sign-in attempt for an email, or refuses it. Attempts are recorded
 * before the password is checked and forgotten when one succeeds, so what is
 * counted is failures plus those still being checked: a burst of guesses sent
 * at once cannot all pass the count before any is recorded. The count and the
 * insert are serialized per email by a transaction-scoped advisory lock.
 *
 * Returns undefined when the attempt may go on, else how long until the oldest
 * counted attempt leaves the window (the Retry-After). Unknown emails are
 * counted alike, so the throttle says nothing about which emails exist.
 */
export async function countSignInAttempt(db: Knex, email: string, now: Date): Promise<number | undefined> {
  return db.transaction(async (tx) => {
    await tx.raw("SELECT pg_advisory_xact_lock(hashtextextended(?, 31))", [email]);
    const since = new Date(now.getTime() - SIGN_IN_WINDOW_MS);
    const recent = await tx("sign_in_attempts").select("at").where({ email }).where("at", ">", since).orderBy("at", "desc").limit(MAX_FAILED_SIGN_INS);
    if (recent.length >= MAX_FAILED_SIGN_INS) {
      const oldest = (recent[MAX_FAILED_SIGN_INS - 1]!.at as Date).getTime();
      return Math.max(1, oldest + SIGN_IN_WINDOW_MS - now.getTime());
    }
    await tx("sign_in_attempts").insert({ email, at: now });
    // Rows out of the window no longer count: each attempt drops a few of the oldest (of any email), so
    // the table holds about one window's attempts however many emails are tried.
    await tx.raw(`DELETE FROM sign_in_attempts WHERE id IN (SELECT id FROM sign_in_attempts WHERE at <= ? ORDER BY id LIMIT ?)`, [since, STALE_ROWS_DROPPED]);
    return undefined;
  });
}

/** A successful sign-in clears the email's counted attempts. */
export async function clearSignInAttempts(db: Knex | Knex.Transaction, email: string): Promise<void> {
  await db("sign_in_attempts").where({ email }).delete();
}
