import { decisionReserveUnits, type MeteredCall } from "../../src/metering/meter.js";

/** A one-question decision call for the meter, with a fresh request id; tests override what they vary. */
export function meteredCall(apiKey: string, init: Partial<MeteredCall> = {}): MeteredCall {
  return {
    apiKey,
    requestId: crypto.randomUUID(),
    endpoint: "decide",
    reserveUnits: decisionReserveUnits(1),
    freeAllowed: true,
    timeoutMs: 30_000,
    signal: new AbortController().signal,
    ...init,
  };
}
