import crypto from "node:crypto";

/**
 * Session and invite tokens: 32 random bytes (base64url), as OWASP asks of
 * session ids (at least 64 bits of entropy; this has 256). Only their SHA-256
 * is stored, so a copy of the database cannot be used to sign in.
 */
export function generateToken(): string {
  return crypto.randomBytes(32).toString("base64url");
}

/** The stored form of a token. */
export function hashToken(token: string): Buffer {
  return crypto.createHash("sha256").update(token).digest();
}

/** True when the text could be a token this module made: anything else is refused without a lookup. */
export function isWellFormedToken(token: string): boolean {
  return /^[A-Za-z0-9_-]{43}$/.test(token);
}
