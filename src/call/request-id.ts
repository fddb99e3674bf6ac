import crypto from "node:crypto";

/** A new request id: the one place ids are made, so every door's ids look alike (a UUID, which billing records reuse). */
export function createRequestId(): string {
  return crypto.randomUUID();
}
