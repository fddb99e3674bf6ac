import type { Knex } from "knex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config.js";
import { createKnex, migrate } from "../../src/db/database.js";
import { describeError } from "../../src/errors.js";
import { createLogger } from "../../src/logger.js";
import { NO_KEY_LIMITS, setKeyLimits } from "../../src/keys/key-limits.js";
import { prepareStatementsOn } from "../../src/metering/ledger.js";
import { createMeter } from "../../src/metering/meter.js";
import { unitsToCredits } from "../../src/units.js";
import { createTestAccount } from "../support/app.js";
import { assertInvariants } from "../support/invariants.js";
import { meteredCall } from "../support/metering.js";
import { postgresBinaries, startPrivateCluster, type PrivateCluster } from "../support/private-cluster.js";

/**
 * A PostgreSQL crash in the middle of a call (`pg_ctl stop -m immediate`, as
 * after `kill -9`, then recovery from the WAL), on a private cluster.
 *
 * An admission commits with `synchronous_commit = off` (ledger.ts): it is not
 * waited for on disk, the settle is. The WAL writer is set to wake only every
 * 10 s, so an admission made just before the crash is really lost; a settle
 * written before the crash carries its own admission with it. Either way the
 * caller's answer agrees with the ledger.
 *
 * Needs Debian's PostgreSQL server binaries (initdb), which CI has since it
 * runs PostgreSQL; without DATABASE_URL a machine without them runs no crash.
 */
const binaries = postgresBinaries();

describe.runIf(binaries !== undefined || process.env.DATABASE_URL !== undefined)("a PostgreSQL crash mid-call", () => {
  let cluster: PrivateCluster;
  let db: Knex;

  beforeAll(async () => {
    cluster = await startPrivateCluster({ wal_writer_delay: "10s" });
    db = createKnex(cluster.url, 4);
    await migrate(db, { useAdvisoryLock: true });
    await prepareStatementsOn(db);
  });
  afterAll(async () => {
    await db?.destroy();
    cluster?.stop();
  });

  it("a settle from before the crash survives with its hold; an admission lost in it withholds the answer and bills nothing", async () => {
    const { apiKey, accountId } = await createTestAccount(db, { units: 100_000 });
    const meter = createMeter({ db, config: loadConfig({}).metering, logger: createLogger("silent") });

    const settledCall = meteredCall(apiKey, { freeAllowed: false });
    const settled = await meter.run(settledCall, async () => ({ value: "yes", chargeUnits: 1_234 }));
    expect(settled.billing.chargedCredits).toBe(unitsToCredits(1_234));

    const crashedCall = meteredCall(apiKey, { freeAllowed: false });
    const failure = await meter
      .run(crashedCall, async () => {
        cluster.crash();
        return { value: "yes", chargeUnits: 2_000 };
      })
      .catch((err: unknown) => err);

    expect(describeError(failure)).toMatchObject({
      reason: "UNAVAILABLE",
      message: "the call outlived its reservation and was not billed; retry",
    });
    expect(meter.stats()).toMatchObject({ settles: 1, lateSettles: 1, holdsInFlight: 0 });

    const requests = await db("requests").where({ account_id: accountId }).select("id", "status", "charged");
    expect(requests, "the relaxed admission was lost in the crash; the settled call's hold was not").toEqual([
      { id: settledCall.requestId, status: "settled", charged: 1_234 },
    ]);
    const kinds = await db("ledger").where({ account_id: accountId }).orderBy("id").pluck("kind");
    expect(kinds).toEqual(["grant", "hold", "settle"]);
    const account = await db("accounts").where({ id: accountId }).first();
    expect(account).toMatchObject({ balance: 100_000 - 1_234, reserved: 0, in_flight: 0 });
    expect(account.recent).toHaveLength(1);
    await assertInvariants(db, accountId);
  });

  it("a key's budget: the settle from before the crash is counted with its charge, the call lost in it is not, and the budget holds after recovery", async () => {
    const { apiKey, accountId, keyId } = await createTestAccount(db, { units: 1_000_000 });
    const budget = 2 * 32_000 + 1_000;
    await db.transaction((tx) => setKeyLimits(tx, accountId, keyId, { ...NO_KEY_LIMITS, budget: { units: budget, period: "day" } }));
    const meter = createMeter({ db, config: loadConfig({}).metering, logger: createLogger("silent") });

    await meter.run(meteredCall(apiKey, { freeAllowed: false }), async () => ({ value: "yes", chargeUnits: 1_234 }));
    const failure = await meter
      .run(meteredCall(apiKey, { freeAllowed: false }), async () => {
        cluster.crash();
        return { value: "yes", chargeUnits: 30_000 };
      })
      .catch((err: unknown) => err);
    expect(describeError(failure).reason).toBe("UNAVAILABLE");
    expect(await db("api_keys").where({ id: keyId }).first()).toMatchObject({ budget_spent: 1_234 });

    // After recovery: 1,234 spent, so one more full hold fits and a second, racing it, does not.
    const racing = await Promise.allSettled([0, 1].map(() => meter.run(meteredCall(apiKey, { freeAllowed: false }), async () => ({ value: "yes", chargeUnits: 32_000 }))));
    expect(racing.map((r) => (r.status === "fulfilled" ? "OK" : describeError(r.reason).reason)).sort()).toEqual(["KEY_BUDGET_EXCEEDED", "OK"]);
    expect(await db("api_keys").where({ id: keyId }).first()).toMatchObject({ budget_spent: 1_234 + 32_000 });
    await assertInvariants(db, accountId);
  });
});
