import crypto from "node:crypto";
import { Webhook } from "standardwebhooks";

/** A new endpoint secret: `whsec_` and 32 random bytes in base64, as the Standard Webhooks specification shapes it. */
export function generateSecret(): string {
  return `whsec_${crypto.randomBytes(32).toString("base64")}`;
}

/**
 * The three Standard Webhooks headers for one attempt. During a rotation the
 * body is signed with every live secret, space-separated, so a receiver that
 * knows either one verifies it.
 */
export function signedHeaders(webhookId: string, at: Date, body: string, secrets: readonly string[]): Record<string, string> {
  const signatures = secrets.map((secret) => new Webhook(secret).sign(webhookId, at, body));
  return {
    "webhook-id": webhookId,
    "webhook-timestamp": String(Math.floor(at.getTime() / 1000)),
    "webhook-signature": signatures.join(" "),
  };
}
