import crypto from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";

/** One request the receiver got, with what its signature check found. */
export interface Received {
  webhookId: string;
  timestamp: string;
  signatures: string[];
  body: string;
  type: string;
  data: Record<string, unknown>;
  /** Which of the receiver's secrets verified it. */
  verifiedWith: string[];
  at: number;
}

export interface WebhookReceiver {
  url: string;
  received: Received[];
  /** Secrets a signature is checked against; set before the first delivery. */
  secrets: string[];
  /** What to answer: a status (default 200), or "hang" to never answer. */
  answer: (request: Received, index: number) => number | "hang" | { status: number; headers: Record<string, string> };
  /** Called after each request is recorded. */
  onReceived?: (request: Received) => void;
  close(): Promise<void>;
}

/**
 * The Standard Webhooks verification, written from the specification
 * (standard-webhooks.md, "Verifying webhook authenticity"), not from the
 * package the service signs with: the signed content is
 * `${webhook-id}.${webhook-timestamp}.${body}`, HMAC-SHA256 keyed with the
 * base64-decoded part of the secret after `whsec_`, base64-encoded, sent as
 * `v1,<signature>`; several are separated by spaces.
 */
export function verifyStandardWebhook(secret: string, id: string, timestamp: string, body: string, signatureHeader: string): boolean {
  const key = Buffer.from(secret.replace(/^whsec_/, ""), "base64");
  const expected = crypto.createHmac("sha256", key).update(`${id}.${timestamp}.${body}`).digest();
  return signatureHeader.split(" ").some((entry) => {
    const [version, signature] = entry.split(",", 2);
    if (version !== "v1" || !signature) return false;
    const given = Buffer.from(signature, "base64");
    return given.length === expected.length && crypto.timingSafeEqual(given, expected);
  });
}

/** A real HTTP server on loopback that records, verifies and answers webhooks as scripted. */
export async function startWebhookReceiver(): Promise<WebhookReceiver> {
  const hung: http.ServerResponse[] = [];
  const receiver: WebhookReceiver = {
    url: "",
    received: [],
    secrets: [],
    answer: () => 200,
    close: async () => {
      for (const res of hung) res.destroy();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8");
      const header = (name: string) => String(req.headers[name] ?? "");
      let parsed: { type?: string; data?: Record<string, unknown> } = {};
      try {
        parsed = JSON.parse(body);
      } catch {
        // recorded as it came; the test's checks fail on it
      }
      const request: Received = {
        webhookId: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signatures: header("webhook-signature").split(" "),
        body,
        type: parsed.type ?? "",
        data: parsed.data ?? {},
        verifiedWith: receiver.secrets.filter((s) => verifyStandardWebhook(s, header("webhook-id"), header("webhook-timestamp"), body, header("webhook-signature"))),
        at: Date.now(),
      };
      const index = receiver.received.push(request) - 1;
      const answer = receiver.answer(request, index);
      receiver.onReceived?.(request);
      if (answer === "hang") {
        hung.push(res);
        return;
      }
      const { status, headers } = typeof answer === "number" ? { status: answer, headers: {} } : answer;
      res.writeHead(status, { "content-type": "text/plain", ...headers });
      res.end(status < 300 ? "ok" : "no");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  receiver.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks`;
  return receiver;
}

/** A connect hook that refuses anything but loopback, and remembers every address it was asked about. */
export function loopbackOnly(): { hook: (address: string) => void; seen: string[] } {
  const seen: string[] = [];
  return {
    seen,
    hook: (address) => {
      seen.push(address);
      if (!/^(127\.|::1$|::ffff:127\.)/.test(address)) throw new Error(`test guard: refusing to connect to ${address}`);
    },
  };
}
