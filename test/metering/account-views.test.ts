import type { Knex } from "knex";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createApiKey } from "../../src/keys/store.js";
import { listFinishedCalls, readAccountMoney, type CallCursor, type FinishedCall } from "../../src/metering/account-views.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";

/**
 * What members and the operator read of an account: its money as it stands,
 * and its finished calls a page at a time. Hand-worked rows, so that each
 * figure, bound and order is pinned (the usage summaries are pinned beside
 * the roll-up, in usage-rollup.test.ts).
 */
let database: TestDatabase;
let db: Knex;
beforeAll(async () => {
  database = await createTestDatabase(2);
  db = database.db;
});
afterAll(async () => {
  await database?.close();
});

const T0 = Date.UTC(2030, 4, 6, 9);
const at = (ms: number) => new Date(T0 + ms);

interface Row {
  id?: string;
  endpoint?: "decide" | "search";
  keyId?: string | null;
  status: "settled" | "released" | "expired" | "active";
  atMs: number;
  reserved?: number;
  charged?: number;
  /** Defaults to 10 ms after the start for a finished call. */
  resolvedMs?: number | null;
  funding?: "paid" | "free";
}

async function insertCalls(accountId: string, rows: Row[]): Promise<string[]> {
  const inserted = await db("requests")
    .insert(
      rows.map((r) => ({
        ...(r.id ? { id: r.id } : {}),
        account_id: accountId,
        endpoint: r.endpoint ?? "decide",
        funding: r.funding ?? "paid",
        reserved: r.funding === "free" ? 0 : (r.reserved ?? 100),
        charged: r.charged ?? 0,
        status: r.status,
        created_at: at(r.atMs),
        lease_expires_at: at(r.atMs + 60_000),
        resolved_at: r.status === "active" || r.resolvedMs === null ? null : at(r.resolvedMs ?? r.atMs + 10),
        key_id: r.keyId ?? null,
      })),
    )
    .returning("id");
  return inserted.map((row: { id: string }) => row.id);
}

describe("an account's money", () => {
  it("reads the row in units, with what is available and the rate as calls per minute", async () => {
    const { accountId } = await createTestAccount(db, { units: 9_000, freeRequests: 7, name: "money view" });
    await db("accounts").where({ id: accountId }).update({ reserved: 2_500, free_reserved: 3, in_flight: 2, max_in_flight: 4, rate_limit: 10, rate_window_ms: 45_000 });
    const created = (await db("accounts").where({ id: accountId }).first("created_at")).created_at as Date;
    expect(await readAccountMoney(db, accountId)).toEqual({
      id: accountId,
      name: "money view",
      balanceUnits: 9_000,
      heldUnits: 2_500,
      availableUnits: 6_500,
      freeRemaining: 7,
      freeHeld: 3,
      freeAvailable: 4,
      inFlight: 2,
      maxInFlight: 4,
      rateLimit: 10,
      rateWindowMs: 45_000,
      // 10 calls per 45 s = 13.33… a minute, rounded.
      requestsPerMinute: 13,
      createdAt: created,
    });
  });

  it.each([
    [60, 60_000, 60],
    [1, 120_000, 1], // 0.5 a minute rounds up
    [1, 3_600_000, 0],
    [5, 1_000, 300],
    [7, 40_000, 11], // 10.5 rounds up
  ])("%i calls per %i ms read as %i a minute", async (rateLimit, rateWindowMs, perMinute) => {
    const { accountId } = await createTestAccount(db);
    await db("accounts").where({ id: accountId }).update({ rate_limit: rateLimit, rate_window_ms: rateWindowMs });
    expect(await readAccountMoney(db, accountId)).toMatchObject({ rateLimit, rateWindowMs, requestsPerMinute: perMinute });
  });

  it("of an account that does not exist is undefined", async () => {
    expect(await readAccountMoney(db, "00000000-0000-4000-8000-000000000000")).toBeUndefined();
  });
});

describe("an account's finished calls", () => {
  /** Ids in the order a page lists them. */
  const ids = (calls: FinishedCall[]) => calls.map((c) => c.requestId);

  it("are listed newest start first, with every field; calls in flight and other accounts' calls are not", async () => {
    const { accountId, keyId } = await createTestAccount(db);
    const other = await createTestAccount(db);
    const [settled, released, expired] = await insertCalls(accountId, [
      { status: "settled", atMs: 1_000, endpoint: "search", keyId, reserved: 300, charged: 120, resolvedMs: 1_250 },
      { status: "released", atMs: 2_000, reserved: 50, resolvedMs: 2_040, funding: "free" },
      { status: "expired", atMs: 3_000, reserved: 70 },
    ]);
    await insertCalls(accountId, [{ status: "active", atMs: 4_000 }]);
    await insertCalls(other.accountId, [{ status: "settled", atMs: 5_000 }]);
    const page = await listFinishedCalls(db, accountId, {}, { size: 10 });
    expect(page).toEqual({
      more: false,
      calls: [
        { requestId: expired, endpoint: "decide", keyId: "", evaluationId: "", funding: "paid", reservedUnits: 70, chargedUnits: 0, status: "expired", startedAt: at(3_000), finishedAt: at(3_010) },
        { requestId: released, endpoint: "decide", keyId: "", evaluationId: "", funding: "free", reservedUnits: 0, chargedUnits: 0, status: "released", startedAt: at(2_000), finishedAt: at(2_040) },
        { requestId: settled, endpoint: "search", keyId, evaluationId: "", funding: "paid", reservedUnits: 300, chargedUnits: 120, status: "settled", startedAt: at(1_000), finishedAt: at(1_250) },
      ],
    });
  });

  it("a finished call without a recorded end reads as finished when it started", async () => {
    const { accountId } = await createTestAccount(db);
    await insertCalls(accountId, [{ status: "settled", atMs: 7_000, resolvedMs: null }]);
    const { calls } = await listFinishedCalls(db, accountId, {}, { size: 1 });
    expect(calls.map((c) => [c.startedAt, c.finishedAt])).toEqual([[at(7_000), at(7_000)]]);
  });

  it("are filtered by endpoint, key and a start-time range that includes its start and excludes its end", async () => {
    const { accountId, keyId } = await createTestAccount(db);
    const other = await createApiKey(db, accountId, { name: "other" });
    const [a, b, c, d, e] = await insertCalls(accountId, [
      { status: "settled", atMs: 0, endpoint: "decide", keyId },
      { status: "settled", atMs: 1_000, endpoint: "search", keyId: other.keyId },
      { status: "released", atMs: 2_000, endpoint: "decide", keyId: other.keyId },
      { status: "expired", atMs: 3_000, endpoint: "search", keyId },
      { status: "settled", atMs: 4_000, endpoint: "decide" },
    ]);
    const list = async (filter: Parameters<typeof listFinishedCalls>[2]) => ids((await listFinishedCalls(db, accountId, filter, { size: 10 })).calls);
    expect(await list({})).toEqual([e, d, c, b, a]);
    expect(await list({ endpoint: "decide" })).toEqual([e, c, a]);
    expect(await list({ endpoint: "search" })).toEqual([d, b]);
    expect(await list({ keyId })).toEqual([d, a]);
    expect(await list({ keyId: other.keyId, endpoint: "search" })).toEqual([b]);
    expect(await list({ since: at(1_000) })).toEqual([e, d, c, b]);
    expect(await list({ until: at(3_000) })).toEqual([c, b, a]);
    expect(await list({ since: at(1_000), until: at(3_000) })).toEqual([c, b]);
    expect(await list({ since: at(1_001), until: at(2_000) })).toEqual([]);
  });

  it("page by page with a cursor: every call once, ties of the same start ordered by id, `more` until the last", async () => {
    const { accountId } = await createTestAccount(db);
    // Three calls share one start, so only the id tells them apart; their ids are chosen out of insertion order.
    const tied = ["6b000000-0000-4000-8000-000000000000", "ff000000-0000-4000-8000-000000000000", "00000000-0000-4000-8000-00000000000a"];
    await insertCalls(accountId, [
      { status: "settled", atMs: 0 },
      ...tied.map((id) => ({ id, status: "settled" as const, atMs: 5_000 })),
      { status: "settled", atMs: 9_000 },
    ]);
    const all = ids((await listFinishedCalls(db, accountId, {}, { size: 5 })).calls);
    expect(all.slice(1, 4)).toEqual([...tied].sort().reverse());
    const seen: string[] = [];
    const mores: boolean[] = [];
    let after: CallCursor | undefined;
    for (let i = 0; i < 3; i++) {
      const page = await listFinishedCalls(db, accountId, {}, { size: 2, after });
      seen.push(...ids(page.calls));
      mores.push(page.more);
      const last = page.calls.at(-1);
      if (!last) break;
      after = { startedAt: last.startedAt, requestId: last.requestId };
    }
    expect(seen).toEqual(all);
    expect(mores).toEqual([true, true, false]);
    // Exactly a page's worth left: no more after it.
    const four = await listFinishedCalls(db, accountId, {}, { size: 4 });
    expect([four.calls.length, four.more]).toEqual([4, true]);
    const five = await listFinishedCalls(db, accountId, {}, { size: 5 });
    expect([five.calls.length, five.more]).toEqual([5, false]);
    // A cursor inside the tie starts right after that call.
    const middle = { startedAt: at(5_000), requestId: all[2]! };
    expect(ids((await listFinishedCalls(db, accountId, {}, { size: 10, after: middle })).calls)).toEqual(all.slice(3));
  });
});
