import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { grant } from "../../src/admin/account-funding.js";
import { loadConfig } from "../../src/config.js";
import { createLogger } from "../../src/logger.js";
import { createMeter, DECISION_RESERVE_UNITS_PER_QUESTION, type Meter } from "../../src/metering/meter.js";
import { listEvents, readAlertSettings, setAlertSettings } from "../../src/webhooks/events.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { assertInvariants } from "../support/invariants.js";
import { meteredCall } from "../support/metering.js";

/**
 * The balance events, recorded by the account row's trigger in the settle's,
 * grant's or settings change's own transaction: real metered calls through the
 * meter, real grants, and bursts of concurrent settles that cross a threshold
 * together (on a real server they race on a pool of 10).
 */
let database: TestDatabase;
let meter: Meter;
const FLOOR = DECISION_RESERVE_UNITS_PER_QUESTION;

beforeAll(async () => {
  database = await createTestDatabase(10);
  meter = createMeter({ db: database.db, config: loadConfig({}).metering, logger: createLogger("silent") });
});
afterAll(async () => {
  await database?.close();
});

/** A call that reserves what it will charge, so the figures read plainly (a one-question decision reserves FLOOR). */
const spend = (apiKey: string, units: number, reserveUnits = units) =>
  meter.run(meteredCall(apiKey, { reserveUnits, freeAllowed: false }), async () => ({ value: null, chargeUnits: units }));
const events = async (accountId: string) =>
  (await listEvents(database.db, accountId, 100)).reverse().map((e): Record<string, unknown> => ({ type: e.type, ...e.data }));

describe("balance events", () => {
  it("low once per threshold crossed, depleted once, recovered after a grant; nothing in between", async () => {
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 200_000 });
    await setAlertSettings(database.db, accountId, [100_000, 150_000], FLOOR);
    expect(await events(accountId)).toEqual([]);

    await spend(apiKey, 40_000); // 160,000: above both
    expect(await events(accountId)).toEqual([]);
    await spend(apiKey, 20_000); // 140,000: below 150,000
    await spend(apiKey, 10_000); // 130,000: still below, already told
    expect(await events(accountId)).toEqual([{ type: "balance.low", threshold_units: 150_000, balance_units: 140_000, available_units: 140_000 }]);

    await spend(apiKey, 110_000); // 20,000: below 100,000 and below the smallest reservation
    await expect(spend(apiKey, 1, FLOOR)).rejects.toThrow(/balance/i); // 402: the account cannot admit a one-question decision any more
    expect((await events(accountId)).slice(1)).toEqual([
      { type: "balance.low", threshold_units: 100_000, balance_units: 20_000, available_units: 20_000 },
      { type: "balance.depleted", smallest_reservation_units: FLOOR, balance_units: 20_000, available_units: 20_000 },
    ]);

    await grant(database.db, accountId, 100_000, 0); // 120,000: above 100,000 and the floor, below 150,000
    expect((await events(accountId)).slice(3)).toEqual([
      { type: "balance.recovered", thresholds_units: [100_000], depleted_ended: true, balance_units: 120_000, available_units: 120_000 },
    ]);
    await grant(database.db, accountId, 100_000, 0); // 220,000: above all
    await grant(database.db, accountId, 100_000, 0);
    expect((await events(accountId)).slice(4)).toEqual([
      { type: "balance.recovered", thresholds_units: [150_000], depleted_ended: false, balance_units: 220_000, available_units: 220_000 },
    ]);
    expect(await readAlertSettings(database.db, accountId)).toEqual({ thresholdsUnits: [150_000, 100_000], depletionFloorUnits: FLOOR, crossedUnits: [], depleted: false });
    await assertInvariants(database.db, accountId);
  });

  it("a threshold set above the balance records its low at once, in the same statement", async () => {
    const { accountId } = await createTestAccount(database.db, { units: 50_000 });
    await setAlertSettings(database.db, accountId, [100_000], FLOOR);
    expect(await events(accountId)).toEqual([{ type: "balance.low", threshold_units: 100_000, balance_units: 50_000, available_units: 50_000 }]);
    // Setting the same again records nothing new; removing it forgets the crossing.
    await setAlertSettings(database.db, accountId, [100_000], FLOOR);
    await setAlertSettings(database.db, accountId, [], FLOOR);
    expect(await events(accountId)).toHaveLength(1);
    expect((await readAlertSettings(database.db, accountId))?.crossedUnits).toEqual([]);
  });

  it("an account without alerts records nothing, whatever it spends", async () => {
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 100_000 });
    await spend(apiKey, 90_000);
    await grant(database.db, accountId, 1, 0);
    expect(await events(accountId)).toEqual([]);
  });

  it("40 concurrent calls crossing a threshold together record exactly one low", async () => {
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 40 * 40_000 });
    await database.db("accounts").where({ id: accountId }).update({ max_in_flight: 40, rate_limit: 1000 });
    await setAlertSettings(database.db, accountId, [800_000], FLOOR);
    const outcomes = await Promise.allSettled(Array.from({ length: 40 }, () => spend(apiKey, 30_000)));
    expect(outcomes.filter((o) => o.status === "fulfilled")).toHaveLength(40);
    const recorded = await events(accountId);
    expect(recorded.map((e) => e.type)).toEqual(["balance.low"]);
    expect(recorded[0]).toMatchObject({ threshold_units: 800_000 });
    // Available is the balance less the holds of calls still in flight, as admission sees it.
    expect(recorded[0]!.available_units as number).toBeLessThan(800_000);
    await assertInvariants(database.db, accountId);
  });

  it("a release, a grant and a settle of nothing record nothing while holds keep the available balance under a threshold; the next spend records the low once", async () => {
    const { accountId, apiKey } = await createTestAccount(database.db, { units: 200_000 });
    await setAlertSettings(database.db, accountId, [150_000], FLOOR);
    let admitted!: () => void;
    let finish!: () => void;
    const isAdmitted = new Promise<void>((resolve) => (admitted = resolve));
    const finished = new Promise<void>((resolve) => (finish = resolve));
    const holding = meter.run(meteredCall(apiKey, { reserveUnits: 100_000, freeAllowed: false }), async () => {
      admitted();
      await finished;
      return { value: null, chargeUnits: 0 };
    });
    await isAdmitted; // available 100,000: under 150,000 by a hold, the balance untouched

    await expect(
      meter.run(meteredCall(apiKey, { reserveUnits: FLOOR, freeAllowed: false }), async () => {
        throw new Error("upstream failed");
      }),
    ).rejects.toThrow("upstream failed");
    await grant(database.db, accountId, 1, 0);
    finish();
    await holding; // settled, charging nothing
    expect(await events(accountId)).toEqual([]);

    await spend(apiKey, 60_000); // 140,001
    await spend(apiKey, 1_000);
    expect(await events(accountId)).toEqual([{ type: "balance.low", threshold_units: 150_000, balance_units: 140_001, available_units: 140_001 }]);
    await assertInvariants(database.db, accountId);
  });

  it("one statement that moves the balance and sets the alerts records each crossing once", async () => {
    const { accountId } = await createTestAccount(database.db, { units: 200_000 });
    // No code path does this; both of the row's alert triggers then run their function in turn.
    await database.db("accounts").where({ id: accountId }).update({
      balance: database.db.raw("balance - 60000"),
      alert_thresholds: database.db.raw("'{150000}'::bigint[]"),
      alert_floor: FLOOR,
    });
    expect(await events(accountId)).toEqual([{ type: "balance.low", threshold_units: 150_000, balance_units: 140_000, available_units: 140_000 }]);
  });

  it("a transaction that rolls back leaves no event", async () => {
    const { accountId } = await createTestAccount(database.db, { units: 50_000 });
    await expect(
      database.db.transaction(async (tx) => {
        await setAlertSettings(tx, accountId, [100_000], FLOOR);
        throw new Error("rolled back");
      }),
    ).rejects.toThrow("rolled back");
    expect(await events(accountId)).toEqual([]);
  });
});
