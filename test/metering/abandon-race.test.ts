import crypto from "node:crypto";
import type { Knex } from "knex";
import { beforeAll, describe, expect, it } from "vitest";
import { hashApiKey } from "../../src/keys/api-keys.js";
import { abandon } from "../../src/metering/ledger.js";
import { createTestAccount } from "../support/app.js";
import { sessionsCanRace, useRacingDatabase } from "../support/database.js";
import { assertInvariants } from "../support/invariants.js";
import { waitFor } from "../support/wait.js";

/**
 * An abandon and the admission it gives up on, in flight at the same moment
 * on two sessions (migration 20261125000000_refuse_abandoned_admissions):
 * whichever commits first, the other waits for it on the advisory lock and
 * then does the right thing, so a hold is never left behind. Two sessions at
 * once need a real PostgreSQL server (the embedded store runs one statement
 * at a time): the one of DATABASE_URL, else a private cluster, as
 * crash.test.ts does.
 */
describe.runIf(sessionsCanRace)("an abandon and its admission in flight at the same moment", () => {
  const racing = useRacingDatabase(4);
  let db: Knex;
  beforeAll(() => {
    db = racing();
  });

  const T0 = new Date("2031-03-01T12:00:00.250Z");
  /** True while some session waits for an advisory lock: the one the two sides meet on. */
  const someoneWaitsForTheLock = async () =>
    (await db.raw<{ rows: Array<{ n: number }> }>("SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")).rows[0]!.n > 0;
  const admitIn = (session: Knex, apiKey: string, requestId: string) =>
    session.raw("SELECT (metering_admit_unless_abandoned(?, 'decide', 32000, false, 90000, NULL, NULL, ?, ?::uuid)).outcome", [hashApiKey(apiKey), T0, requestId]);
  const accountRow = (accountId: string) => db("accounts").where({ id: accountId }).first();

  it("an abandon that meets an admission not yet committed waits for it, then releases its hold", async () => {
    const { apiKey, accountId } = await createTestAccount(db, { units: 32_000 });
    const requestId = crypto.randomUUID();
    const admitting = await db.transaction();
    try {
      await admitIn(admitting, apiKey, requestId);
      const abandoning = abandon(db, { requestId, now: new Date(T0.getTime() + 1) });
      await waitFor(someoneWaitsForTheLock, "the abandon to wait for the admission");
      await admitting.commit();
      expect(await abandoning).toMatchObject({ outcome: "released", reservedUnits: 32_000 });
    } finally {
      if (!admitting.isCompleted()) await admitting.rollback();
    }
    expect(await db("abandoned_admissions").where({ request_id: requestId }).first()).toBeUndefined();
    expect(await accountRow(accountId)).toMatchObject({ reserved: 0, in_flight: 0 });
    await assertInvariants(db, accountId);
  });

  it("an admission that meets an abandon not yet committed waits for it, then rolls itself back", async () => {
    const { apiKey, accountId } = await createTestAccount(db, { units: 32_000 });
    const requestId = crypto.randomUUID();
    const abandoning = await db.transaction();
    try {
      await abandoning.raw("SELECT (metering_abandon(?::uuid, ?)).outcome", [requestId, new Date(T0.getTime() - 1)]);
      const admitting = admitIn(db, apiKey, requestId).then(
        () => "admitted",
        (err: Error) => err.message,
      );
      await waitFor(someoneWaitsForTheLock, "the admission to wait for the abandon");
      await abandoning.commit();
      expect(await admitting).toMatch(`request ${requestId} was abandoned by its caller`);
    } finally {
      if (!abandoning.isCompleted()) await abandoning.rollback();
    }
    expect(await db("requests").where({ id: requestId }).first()).toBeUndefined();
    expect(await accountRow(accountId)).toMatchObject({ reserved: 0, in_flight: 0 });
    await assertInvariants(db, accountId);
  });
});
