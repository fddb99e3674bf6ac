import { REASONS } from "../../src/errors.js";

/** gRPC's canonical status names by number (grpc/grpc doc/statuscodes.md); Connect's enum spells CANCELLED differently. */
const GRPC_STATUS_NAMES = [
  "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
  "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
];

/**
 * The README's error table, made from the one table of reasons: one row per
 * reason, in its order. `npm run docs:generate` writes it into the README
 * (generated.ts); test/docs/docs.test.ts fails while the README's copy differs.
 */
export function renderErrorTable(): string {
  const rows = Object.entries(REASONS).map(
    ([reason, r]) => `| ${reason} | ${r.http} | ${GRPC_STATUS_NAMES[r.grpc]} | ${r.envelope} | ${r.meaning} |`,
  );
  return ["| reason | HTTP | gRPC | code | meaning |", "|---|---|---|---|---|", ...rows].join("\n");
}
