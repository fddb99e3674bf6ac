import { describe, expect, it } from "vitest";
import type { FinishResult, FinishInput } from "../../src/metering/ledger.js";
import { NoPrimaryError } from "../../src/db/primary-client.js";
import { asOwnOutcome, finishWithRetry } from "../../src/metering/finish-with-retry.js";

/**
 * A settle or release retried after a lost reply: which answers count as the
 * call's own outcome, and which errors are retried.
 */
const account = { accountId: "acc", balanceUnits: 62_766, availableUnits: 62_766, freeRemaining: 0, freeAvailable: 0 };
const notActive = (status: "settled" | "released" | "expired", init: Partial<FinishResult> = {}): FinishResult =>
  ({ outcome: "not_active", requestId: "r1", status, funding: "paid", reservedUnits: 32_000, chargedUnits: 1_234, ...account, ...init }) as FinishResult;
const settle = (actualUnits?: number): FinishInput => ({ requestId: "r1", success: true, actualUnits });
const release: FinishInput = { requestId: "r1", success: false };

describe("asOwnOutcome", () => {
  it.each<{ name: string; resolution: FinishResult; input: FinishInput; expected: Partial<FinishResult> & { outcome: string } }>([
    {
      name: "a settle finding its request settled: settled",
      resolution: notActive("settled"),
      input: settle(1_234),
      expected: { outcome: "settled", capped: false, ...account },
    },
    {
      name: "a release finding it released: released",
      resolution: notActive("released", { chargedUnits: 0 }),
      input: release,
      expected: { outcome: "released", capped: false },
    },
    {
      name: "a settle above the reservation: capped",
      resolution: notActive("settled", { chargedUnits: 32_000 }),
      input: settle(40_000),
      expected: { outcome: "settled", capped: true },
    },
    {
      name: "a settle exactly at the reservation: not capped",
      resolution: notActive("settled", { chargedUnits: 32_000 }),
      input: settle(32_000),
      expected: { outcome: "settled", capped: false },
    },
    {
      name: "a free call is never capped",
      resolution: notActive("settled", { funding: "free", reservedUnits: 0, chargedUnits: 0 }),
      input: settle(5),
      expected: { outcome: "settled", capped: false },
    },
    {
      name: "a settle of unknown cost is not capped",
      resolution: notActive("settled"),
      input: settle(undefined),
      expected: { outcome: "settled", capped: false },
    },
    {
      name: "a settle finding it released: not its own",
      resolution: notActive("released"),
      input: settle(1_234),
      expected: { outcome: "not_active", status: "released" },
    },
    {
      name: "a release finding it settled: not its own",
      resolution: notActive("settled"),
      input: release,
      expected: { outcome: "not_active", status: "settled" },
    },
    {
      name: "a settle finding it expired: not its own",
      resolution: notActive("expired"),
      input: settle(1_234),
      expected: { outcome: "not_active", status: "expired" },
    },
    {
      name: "not found stays not found",
      resolution: { outcome: "not_found", requestId: "r1" },
      input: settle(1_234),
      expected: { outcome: "not_found" },
    },
  ])("$name", ({ resolution, input, expected }) => {
    const own = asOwnOutcome(resolution, input);
    expect(own).toMatchObject(expected);
    if (own.outcome !== "not_active" && own.outcome !== "not_found") expect(own).not.toHaveProperty("status");
  });
});

/** The error pg raises when the server's side of the connection goes away (a Node system error: https://nodejs.org/api/errors.html#common-system-errors). */
const connectionReset = () => Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET", errno: -104, syscall: "read" });

/** A statement that answers each attempt from `answers` in turn: an error to throw or a resolution to return. */
function statementAnswering(answers: (Error | FinishResult)[]) {
  const attempts: FinishInput[] = [];
  const statement = async (input: FinishInput) => {
    attempts.push(input);
    const answer = answers.shift();
    if (answer === undefined) throw new Error("no answer left");
    if (answer instanceof Error) throw answer;
    return answer;
  };
  return { statement, attempts };
}

describe("finishWithRetry", () => {
  it("a first attempt that finds the request settled did not settle it: answered as found", async () => {
    const { statement } = statementAnswering([notActive("settled")]);
    expect(await finishWithRetry(statement, settle(1_234), [0])).toMatchObject({ outcome: "not_active", status: "settled" });
  });

  it("a retry after a lost connection that finds it settled found its own earlier attempt", async () => {
    const { statement, attempts } = statementAnswering([connectionReset(), connectionReset(), notActive("settled")]);
    expect(await finishWithRetry(statement, settle(1_234), [0, 0])).toMatchObject({ outcome: "settled", ...account });
    expect(attempts).toHaveLength(3);
  });

  it("a failover is retried until the new primary settles: the old one refusing writes (25006), then no node accepting them", async () => {
    const readOnly = Object.assign(new Error("cannot execute UPDATE in a read-only transaction"), { code: "25006" });
    const noPrimary = new NoPrimaryError(["127.0.0.1:5501: read-only", "127.0.0.1:5502: connect ECONNREFUSED 127.0.0.1:5502"]);
    const settled = { outcome: "settled", requestId: "r1", funding: "paid", reservedUnits: 32_000, chargedUnits: 1_234, capped: false, ...account } as FinishResult;
    const { statement, attempts } = statementAnswering([readOnly, noPrimary, noPrimary, settled]);
    expect(await finishWithRetry(statement, settle(1_234), [0, 0, 0])).toMatchObject({ outcome: "settled", chargedUnits: 1_234 });
    expect(attempts).toHaveLength(4);
  });

  it("gives up after the last delay with the database's error", async () => {
    const { statement, attempts } = statementAnswering([connectionReset(), connectionReset(), connectionReset()]);
    await expect(finishWithRetry(statement, settle(1_234), [0, 0])).rejects.toThrow("ECONNRESET");
    expect(attempts).toHaveLength(3);
  });

  it("never retries an error of the statement itself", async () => {
    const { statement, attempts } = statementAnswering([new Error("metering_resolve: actual must be >= 0, got -1"), notActive("settled")]);
    await expect(finishWithRetry(statement, settle(-1), [0, 0])).rejects.toThrow("actual must be");
    expect(attempts).toHaveLength(1);
  });
});
