import type { Knex } from "knex";
import { grant as meteringGrant } from "../metering/ledger.js";
import { isUuid } from "../validation.js";

/**
 * Opening and funding accounts, for the operator. A grant moves money, so it
 * goes through metering with its ledger row; these operations span accounts
 * and metering and therefore sit above both.
 */

/** A row of `accounts`; money columns are integer units. */
export interface DbAccountRow {
  id: string;
  name: string;
  balance: number;
  reserved: number;
  free_remaining: number;
  free_reserved: number;
  in_flight: number;
  created_at: Date;
}

/** Inserts an account row with empty balances; its opening credits are granted by the caller, through metering. */
export async function insertAccount(db: Knex | Knex.Transaction, name: string): Promise<DbAccountRow> {
  const [account] = await db<DbAccountRow>("accounts").insert({ name }).returning("*");
  return account!;
}

/** The account row of an id, or undefined (also for an id that is not a UUID). */
export async function findAccount(db: Knex | Knex.Transaction, accountId: string): Promise<DbAccountRow | undefined> {
  if (!isUuid(accountId)) return undefined;
  return db<DbAccountRow>("accounts").where({ id: accountId }).first();
}

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
