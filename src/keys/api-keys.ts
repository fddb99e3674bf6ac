import crypto from "node:crypto";
import zlib from "node:zlib";
import type { ConnectError } from "@connectrpc/connect";
import { apiError } from "../errors.js";

/**
 * API keys look like `ts_live_<43 base62 chars><6 base62 checksum chars>`:
 * 256 bits of randomness, a prefix secret scanners can match, and a CRC32
 * checksum (as GitHub's tokens have) so malformed keys are refused without a
 * database lookup. Only the SHA-256 of a key is ever stored.
 */
export const KEY_PREFIX = "ts_live_";
const BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const RANDOM_CHARS = 43; // 62^43 > 2^256
const CHECKSUM_CHARS = 6; // 62^6 > 2^32
const KEY_PATTERN = new RegExp(`^${KEY_PREFIX}[0-9A-Za-z]{${RANDOM_CHARS + CHECKSUM_CHARS}}$`);

export function generateApiKey(): string {
  const random = encodeBase62(BigInt("0x" + crypto.randomBytes(32).toString("hex")), RANDOM_CHARS);
  return KEY_PREFIX + random + checksum(random);
}

/** Shape and checksum only; says nothing about whether the key exists. */
export function isWellFormedApiKey(key: string): boolean {
  if (!KEY_PATTERN.test(key)) return false;
  const body = key.slice(KEY_PREFIX.length);
  return checksum(body.slice(0, RANDOM_CHARS)) === body.slice(RANDOM_CHARS);
}

/** What is stored of a key: its SHA-256 (in one call, which costs a third of a Hash object on every request). */
export function hashApiKey(key: string): Buffer {
  return crypto.hash("sha256", key, "buffer");
}

/** The same SHA-256 as base64 text: what a process keeps per key in a map, never the key itself. */
export function apiKeyHashText(key: string): string {
  return crypto.hash("sha256", key, "base64");
}

/** What may be shown of a key in listings: its prefix and first characters. */
export function displayPrefix(key: string): string {
  return key.slice(0, KEY_PREFIX.length + 6);
}

/** The key of an `Authorization: Bearer <key>` header, or undefined. */
function bearerToken(header: string | null | undefined): string | undefined {
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header ?? "");
  return match?.[1];
}

/** The refusal of a key of the wrong shape, wherever the shape is checked. */
export function malformedApiKey(): ConnectError {
  return apiError("UNAUTHENTICATED", `malformed API key: expected Authorization: Bearer ${KEY_PREFIX}...`);
}

/**
 * The key of an `authorization: Bearer <key>` header (HTTP header or gRPC
 * metadata), or the UNAUTHENTICATED error saying what is wrong with it. Shape
 * and checksum only, without the database, so a malformed key never costs a
 * round trip.
 */
export function apiKeyFrom(authorization: string | null | undefined): { key: string } | { error: ConnectError } {
  if (!authorization) return { error: apiError("UNAUTHENTICATED", "missing API key: send Authorization: Bearer <key>") };
  const key = bearerToken(authorization);
  if (!key || !isWellFormedApiKey(key)) return { error: malformedApiKey() };
  return { key };
}

function checksum(random: string): string {
  return encodeBase62(BigInt(zlib.crc32(random)), CHECKSUM_CHARS);
}

function encodeBase62(value: bigint, width: number): string {
  let out = "";
  let rest = value;
  for (let i = 0; i < width; i++) {
    out = BASE62[Number(rest % 62n)] + out;
    rest /= 62n;
  }
  return out;
}
