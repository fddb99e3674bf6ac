import type { ConnectError } from "@connectrpc/connect";
import { apiError } from "../errors.js";

/**
 * The longest delay a Node timer holds: a longer one overflows and fires at
 * once, so a deadline beyond it is treated as no deadline at all (it is
 * weeks away; no call runs that long).
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** gRPC's timeout units in milliseconds (hours down to nanoseconds). */
const GRPC_UNIT_MS: Readonly<Record<string, number>> = { H: 3_600_000, M: 60_000, S: 1_000, m: 1, u: 0.001, n: 0.000_001 };

/** The gRPC timeout format: 1 to 8 digits, then the unit (the gRPC over HTTP/2 protocol description). */
const GRPC_TIMEOUT = /^(\d{1,8})([HMSmun])$/;
/** The Connect timeout format: 1 to 10 digits of milliseconds (the Connect protocol description). */
const CONNECT_TIMEOUT = /^\d{1,10}$/;

/** Where a protocol carries its deadline, and how it is written. */
interface DeadlineHeader {
  name: string;
  rule: string;
  parse: (value: string) => number | undefined;
}

const GRPC_DEADLINE: DeadlineHeader = {
  name: "grpc-timeout",
  rule: "1 to 8 digits followed by a unit: H, M, S, m, u or n",
  parse(value) {
    const match = GRPC_TIMEOUT.exec(value);
    return match ? Number(match[1]) * GRPC_UNIT_MS[match[2]!]! : undefined;
  },
};

const CONNECT_DEADLINE: DeadlineHeader = {
  name: "connect-timeout-ms",
  rule: "1 to 10 digits of milliseconds",
  parse: (value) => (CONNECT_TIMEOUT.test(value) ? Number(value) : undefined),
};

/**
 * Reads a request's deadline header (grpc-timeout on gRPC and gRPC-Web,
 * connect-timeout-ms on Connect) as the protocols define it and leaves
 * Connect a value its timer can hold: a deadline beyond MAX_TIMER_MS is
 * removed (no practical deadline); a malformed one is removed too and
 * answered as INVALID_ARGUMENT naming the header, which is what connect-es
 * answers for it (grpc-go says INTERNAL, which our contract keeps for our own
 * faults). Returns that error, or undefined.
 */
export function takeDeadlineProblem(header: Headers, grpcFamily: boolean): ConnectError | undefined {
  const deadline = grpcFamily ? GRPC_DEADLINE : CONNECT_DEADLINE;
  const value = header.get(deadline.name);
  if (value === null) return undefined;
  const timeoutMs = deadline.parse(value);
  if (timeoutMs !== undefined && timeoutMs <= MAX_TIMER_MS) return undefined;
  header.delete(deadline.name);
  if (timeoutMs !== undefined) return undefined;
  return apiError("INVALID_ARGUMENT", `${deadline.name}: must be ${deadline.rule}`, { field: deadline.name, rule: deadline.rule });
}

/**
 * For calls Connect's handler reads alone (streaming): removes a deadline too
 * long for a timer and leaves any other value to Connect, which refuses a
 * malformed one itself.
 */
export function dropUnholdableDeadline(header: Headers, grpcFamily: boolean): void {
  const deadline = grpcFamily ? GRPC_DEADLINE : CONNECT_DEADLINE;
  const value = header.get(deadline.name);
  const timeoutMs = value === null ? undefined : deadline.parse(value);
  if (timeoutMs !== undefined && timeoutMs > MAX_TIMER_MS) header.delete(deadline.name);
}

/** The timeout in milliseconds of a grpc-timeout value already checked by takeDeadlineProblem (undefined: no deadline). */
export function grpcTimeoutMs(value: string | null): number | undefined {
  return value === null ? undefined : GRPC_DEADLINE.parse(value);
}
