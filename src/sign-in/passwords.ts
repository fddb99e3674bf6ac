import crypto from "node:crypto";
import { promisify } from "node:util";

const scrypt = promisify(crypto.scrypt) as (password: string, salt: Buffer, keylen: number, options: crypto.ScryptOptions) => Promise<Buffer>;

/** The shortest password a member may set (OWASP's minimum when no second factor is used). */
export const MIN_PASSWORD_CHARS = 12;
/** Longer passwords are refused: scrypt's cost grows with the input, and nobody types more. */
export const MAX_PASSWORD_CHARS = 256;

/** scrypt cost parameters: OWASP's recommended N=2^17, r=8, p=1, 32-byte key, 16-byte salt. */
export const SCRYPT_PARAMS = { N: 131_072, r: 8, p: 1, keyBytes: 32, saltBytes: 16 } as const;

/** The most memory a stored hash may ask scrypt for (128 * N * r bytes): twice what the parameters above take. */
const MAX_SCRYPT_BYTES = 256 * 1024 * 1024;
/** Node refuses scrypt above `maxmem` (default 32 MiB), counted with some overhead: room above MAX_SCRYPT_BYTES. */
const MAX_MEM = 2 * MAX_SCRYPT_BYTES;

/**
 * How long a password is, by the one count every rule uses: code points of
 * its NFC form, which is what is hashed. (UTF-16 units would count an emoji
 * twice, so a password could be set under one count and refused under another.)
 */
export function passwordLength(password: string): number {
  return [...password.normalize("NFC")].length;
}

/** Which length rule a new password breaks, or undefined; its strength is password-strength.ts's. */
export function passwordProblem(password: string): string | undefined {
  const chars = passwordLength(password);
  if (chars < MIN_PASSWORD_CHARS) return `at least ${MIN_PASSWORD_CHARS} characters`;
  if (chars > MAX_PASSWORD_CHARS) return `at most ${MAX_PASSWORD_CHARS} characters`;
  return undefined;
}

/**
 * A password's stored form, `scrypt$N$r$p$salt$hash` (base64url): a fresh
 * random salt per password, and the parameters beside the hash so they can
 * be raised later without breaking stored passwords.
 */
export async function hashPassword(password: string, params: ScryptParams = SCRYPT_PARAMS): Promise<string> {
  const salt = crypto.randomBytes(params.saltBytes);
  const hash = await scrypt(password.normalize("NFC"), salt, params.keyBytes, options(params));
  return ["scrypt", params.N, params.r, params.p, salt.toString("base64url"), hash.toString("base64url")].join("$");
}

/** The cost parameters of a stored hash. */
export interface ScryptParams {
  N: number;
  r: number;
  p: number;
  keyBytes: number;
  saltBytes: number;
}

/**
 * True when the password matches the stored form, compared in constant time.
 * A stored form this module did not write never matches, and costs the
 * scrypt work of `fallback` (the parameters of new hashes), so it cannot be
 * told apart by timing.
 */
export async function verifyPassword(password: string, stored: string, fallback: ScryptParams = SCRYPT_PARAMS): Promise<boolean> {
  const parsed = parseStored(stored);
  const params = parsed?.params ?? fallback;
  const salt = parsed?.salt ?? Buffer.alloc(params.saltBytes);
  const expected = parsed?.hash ?? Buffer.alloc(params.keyBytes);
  const actual = await scrypt(password.normalize("NFC"), salt, expected.length, options(params));
  return crypto.timingSafeEqual(actual, expected) && parsed !== undefined;
}

/**
 * A stored form of a password nobody knows, for verifying against when the
 * email is unknown: with the parameters new passwords get, the answer then
 * takes as long as for a known email. Random bytes stand where the hash
 * would be: checking against them costs the same scrypt and never matches,
 * and making them costs no scrypt (whose 128 MiB at start-up were the
 * service's peak memory).
 */
export function createDummyHash(params: ScryptParams = SCRYPT_PARAMS): string {
  const random = (bytes: number) => crypto.randomBytes(bytes).toString("base64url");
  return ["scrypt", params.N, params.r, params.p, random(params.saltBytes), random(params.keyBytes)].join("$");
}

const STORED = /^scrypt\$(\d+)\$(\d+)\$(\d+)\$([A-Za-z0-9_-]+)\$([A-Za-z0-9_-]+)$/;

function parseStored(stored: string): { params: ScryptParams; salt: Buffer; hash: Buffer } | undefined {
  const match = STORED.exec(stored);
  if (!match) return undefined;
  const [N, r, p] = [Number(match[1]), Number(match[2]), Number(match[3])];
  const salt = Buffer.from(match[4]!, "base64url");
  const hash = Buffer.from(match[5]!, "base64url");
  // Refuses a stored form whose parameters would be absurd to compute (a row written by something else).
  if (N < 2 || (N & (N - 1)) !== 0 || r < 1 || 128 * N * r > MAX_SCRYPT_BYTES || p < 1 || p > 16 || hash.length < 16) return undefined;
  return { params: { N, r, p, keyBytes: hash.length, saltBytes: salt.length }, salt, hash };
}

function options(params: ScryptParams): crypto.ScryptOptions {
  return { N: params.N, r: params.r, p: params.p, maxmem: MAX_MEM };
}
