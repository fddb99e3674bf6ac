import type { Knex } from "knex";
import { findAccount, insertAccount, isUuid, type DbAccountRow } from "../accounts/store.js";
import { grant as meteringGrant } from "../metering/ledger.js";

/**
 * Opening and funding accounts, for the operator. A grant moves money, so it
 * goes through metering with its ledger row; these operations span accounts
 * and metering and therefore sit above both.
 */

/** Creates an account and grants its opening credits and free requests, with ledger rows. */
export async function createAccount(
  db: Knex,
  init: { name: string; units: number; freeRequests: number },
): Promise<DbAccountRow> {
  return db.transaction(async (tx) => {
    const account = await insertAccount(tx, init.name);
    await grant(tx, account.id, init.units, init.freeRequests);
    return (await findAccount(tx, account.id))!;
  });
}

/** Adds credits (units) and free requests to an account, with their ledger rows (metering_grant). */
export async function grant(
  db: Knex | Knex.Transaction,
  accountId: string,
  units: number,
  freeRequests: number,
): Promise<DbAccountRow | undefined> {
  if (!isUuid(accountId)) return undefined;
  const granted = await meteringGrant(db, { accountId, units, freeRequests });
  return granted && findAccount(db, accountId);
}
