import crypto from "node:crypto";
import type { Knex } from "knex";
import { beforeAll, describe, expect, it } from "vitest";
import { hashApiKey } from "../../src/keys/api-keys.js";
import { admitMany, finishMany, type Admission, type AdmitInput } from "../../src/metering/ledger.js";
import { createTestAccount } from "../support/app.js";
import { sessionsCanRace, useRacingDatabase } from "../support/database.js";
import { assertInvariants } from "../support/invariants.js";
import { waitFor } from "../support/wait.js";

/**
 * Two batches that name the same accounts in opposite orders, in flight at
 * the same moment on two sessions (migration
 * 20261125120000_batch_metering_statements): each item keeps its account's
 * row locked until its batch commits, so taken in the order sent, each batch
 * would hold the row the other waits for, and PostgreSQL would kill one as a
 * deadlock. Taken in the order of the accounts' ids, the second waits behind
 * the first. Two sessions at once need a real PostgreSQL server (the embedded
 * store runs one statement at a time): the one of DATABASE_URL, else a
 * private cluster (useRacingDatabase).
 */
describe.runIf(sessionsCanRace)("batches that name the same accounts in opposite orders", () => {
  const racing = useRacingDatabase(4);
  let db: Knex;
  beforeAll(() => {
    db = racing();
  });

  const T0 = new Date("2031-03-01T12:00:00.250Z");
  const sessionsWaitingForALock = async () =>
    (
      await db.raw<{ rows: Array<{ n: number }> }>(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
      )
    ).rows[0]!.n;
  const admission = (apiKey: string): AdmitInput => ({
    keyHash: hashApiKey(apiKey),
    endpoint: "decide",
    reserveUnits: 1_000,
    freeAllowed: false,
    leaseMs: 90_000,
    now: T0,
    requestId: crypto.randomUUID(),
  });
  const admittedIds = (answers: Admission[]) =>
    answers.map((answer) => {
      if (answer.outcome !== "admitted") throw new Error(`expected an admission, got ${answer.outcome}`);
      return answer.requestId;
    });

  it("both commit, the second after the first, and their settles in opposite orders too", async () => {
    const [low, high] = (await Promise.all([createTestAccount(db, { units: 100_000 }), createTestAccount(db, { units: 100_000 })])).sort((a, b) =>
      a.accountId.localeCompare(b.accountId),
    );
    // Both rows locked while the batches arrive, so that each has to wait at its first account.
    const locker = await db.transaction();
    let admitted: string[][];
    try {
      await locker.raw("SELECT 1 FROM accounts WHERE id IN (?, ?) FOR UPDATE", [low!.accountId, high!.accountId]);
      const lowFirst = admitMany(db, [admission(low!.apiKey), admission(high!.apiKey)], 20_000);
      const highFirst = admitMany(db, [admission(high!.apiKey), admission(low!.apiKey)], 20_000);
      await waitFor(async () => (await sessionsWaitingForALock()) >= 2, "both batches to wait for the accounts");
      await locker.commit();
      admitted = (await Promise.all([lowFirst, highFirst])).map(admittedIds);
    } finally {
      if (!locker.isCompleted()) await locker.rollback();
    }

    const settle = (requestId: string) => ({ requestId, success: true, actualUnits: 10 });
    const relocker = await db.transaction();
    try {
      await relocker.raw("SELECT 1 FROM accounts WHERE id IN (?, ?) FOR UPDATE", [low!.accountId, high!.accountId]);
      // admitted[0] names low's request first, admitted[1] high's.
      const lowFirst = finishMany(db, admitted[0]!.map(settle), 20_000);
      const highFirst = finishMany(db, admitted[1]!.map(settle), 20_000);
      await waitFor(async () => (await sessionsWaitingForALock()) >= 2, "both settles to wait for the accounts");
      await relocker.commit();
      const answers = (await Promise.all([lowFirst, highFirst])).flat();
      expect(answers.map((answer) => answer.outcome)).toEqual(["settled", "settled", "settled", "settled"]);
    } finally {
      if (!relocker.isCompleted()) await relocker.rollback();
    }
    for (const account of [low!, high!]) {
      expect(await db("accounts").where({ id: account.accountId }).first()).toMatchObject({ balance: 99_980, reserved: 0, in_flight: 0 });
      await assertInvariants(db, account.accountId);
    }
  });
});
