import { Code, ConnectError } from "@connectrpc/connect";
import type { Compression } from "@connectrpc/connect/protocol";
import { compressionBrotli, compressionGzip } from "@connectrpc/connect-node";
import { apiError } from "../errors.js";
import { payloadTooLarge } from "./body.js";

/**
 * The body encodings the service accepts on every door, besides identity.
 * The RPC router negotiates with this same list, so what the body check
 * decompresses is exactly what Connect would.
 */
export const ACCEPTED_COMPRESSIONS: readonly Compression[] = [compressionGzip, compressionBrotli];

/** The accepted encodings as the accept-encoding headers list them. */
export const ACCEPTED_ENCODING_NAMES = ACCEPTED_COMPRESSIONS.map((c) => c.name).join(",");

/**
 * The compression a request's encoding header names: null for none or
 * identity, undefined for an encoding the service does not accept.
 */
export function compressionNamed(encoding: string | null | undefined): Compression | null | undefined {
  if (encoding === null || encoding === undefined || encoding === "identity") return null;
  return ACCEPTED_COMPRESSIONS.find((c) => c.name === encoding);
}

/**
 * The error for an encoding the service does not accept. `acceptHeader` is
 * the header that lists the accepted ones in this protocol (grpc-accept-encoding
 * on gRPC, accept-encoding on Connect and HTTP), sent back with the error as
 * the gRPC compression spec and the Connect protocol ask.
 */
export function unsupportedEncoding(encoding: string, encodingHeader: string, acceptHeader: string): ConnectError {
  const error = apiError("UNSUPPORTED_ENCODING", `${encodingHeader}: "${encoding}" is not accepted; use one of identity,${ACCEPTED_ENCODING_NAMES}`, {
    field: encodingHeader,
    rule: `one of identity,${ACCEPTED_ENCODING_NAMES}`,
    metadata: { encoding },
  });
  error.metadata.set(acceptHeader, ACCEPTED_ENCODING_NAMES);
  return error;
}

/** The error for a compressed body that does not decompress. */
export function undecompressable(encoding: string, rule = `must be valid ${encoding} data`): ConnectError {
  return apiError("INVALID_ARGUMENT", `body: ${rule}`, { field: "body", rule, metadata: { encoding } });
}

/**
 * Decompresses a body, never to more than maxBytes: the inflater stops as
 * soon as its output passes the limit, so a small body that would inflate far
 * beyond it is refused without being inflated whole. Answers the bytes, or
 * the caller's error (PAYLOAD_TOO_LARGE past the limit, INVALID_ARGUMENT for
 * data that does not decompress).
 */
export async function decompressBody(compression: Compression, bytes: Uint8Array, maxBytes: number): Promise<Uint8Array | ConnectError> {
  try {
    return await compression.decompress(bytes, maxBytes);
  } catch (err) {
    // connect-node's zlib wrapper: ResourceExhausted past maxOutputLength, any other code for data that does not inflate.
    if (err instanceof ConnectError && err.code === Code.ResourceExhausted) return payloadTooLarge(maxBytes);
    return undecompressable(compression.name);
  }
}
