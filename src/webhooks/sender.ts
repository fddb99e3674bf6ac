import dns from "node:dns";
import http from "node:http";
import https from "node:https";
import net from "node:net";
import { refusalOf, hostRefusal } from "./address-check.js";
import { hostOf } from "./endpoint-url.js";

/** Resolves a host name to its addresses (every one of them). */
export type Resolve = (host: string) => Promise<string[]>;

/**
 * The system's resolver (getaddrinfo, as any connection would use), or, when
 * the operator names DNS servers, those servers asked directly for A and AAAA.
 */
export function createResolver(dnsServers: readonly string[] | undefined): Resolve {
  if (!dnsServers || dnsServers.length === 0) {
    return async (host) => (await dns.promises.lookup(host, { all: true, verbatim: true })).map((a) => a.address);
  }
  const resolver = new dns.promises.Resolver({ timeout: 2_000, tries: 2 });
  resolver.setServers([...dnsServers]);
  return async (host) => {
    const answers = await Promise.allSettled([resolver.resolve4(host), resolver.resolve6(host)]);
    const addresses = answers.flatMap((a) => (a.status === "fulfilled" ? a.value : []));
    if (addresses.length === 0) throw new Error(`${host} has no address`);
    return addresses;
  };
}

export interface SendOptions {
  resolve: Resolve;
  allowLoopback: boolean;
  /** The whole attempt, from resolving to the end of the answer's head. */
  timeoutMs: number;
  /**
   * Called with the checked address right before connecting to it. The
   * service passes none; tests pass one that refuses anything but loopback,
   * so a check that failed open fails the test before a packet leaves.
   */
  beforeConnect?: (address: string) => void;
}

/** What one attempt got: the status when an answer came, else why not. */
export interface SendOutcome {
  status: number | undefined;
  latencyMs: number;
  error: string;
}

/** The answer's body is read up to this many bytes, then the connection is dropped. */
export const MAX_ANSWER_BYTES = 4096;

/**
 * POSTs one webhook. The host is resolved here and every address it has
 * must be allowed; the connection then goes to the address that was checked
 * (no second lookup a rebinding name could answer differently). Redirects
 * are not followed: a 3xx is an answer like any other non-2xx.
 */
export async function sendWebhook(rawUrl: string, headers: Record<string, string>, body: string, options: SendOptions, signal?: AbortSignal): Promise<SendOutcome> {
  const started = performance.now();
  const done = (status: number | undefined, error: string): SendOutcome => ({ status, latencyMs: Math.round(performance.now() - started), error });
  const deadline = AbortSignal.timeout(options.timeoutMs);
  const abort = signal ? AbortSignal.any([signal, deadline]) : deadline;
  let address: string;
  const url = new URL(rawUrl);
  try {
    address = await pickAddress(hostOf(url), options, abort);
  } catch (err) {
    return done(undefined, err instanceof Error ? err.message : String(err));
  }
  try {
    options.beforeConnect?.(address);
  } catch (err) {
    return done(undefined, `refused before connecting: ${err instanceof Error ? err.message : String(err)}`);
  }
  const client = url.protocol === "https:" ? https : http;
  return new Promise<SendOutcome>((resolve) => {
    const request = client.request(
      {
        protocol: url.protocol,
        host: address,
        family: net.isIP(address),
        port: url.port || (url.protocol === "https:" ? 443 : 80),
        path: `${url.pathname}${url.search}`,
        method: "POST",
        // The certificate is checked against the name, the connection goes to the checked address.
        servername: net.isIP(hostOf(url)) === 0 ? hostOf(url) : undefined,
        headers: { ...headers, host: url.host, "content-type": "application/json", "content-length": Buffer.byteLength(body), "user-agent": "typesafe-webhooks" },
        agent: false,
        // No name is left to resolve; a lookup here would mean a path around the check.
        lookup: () => {
          throw new Error("no lookup: the address was resolved and checked before");
        },
        signal: abort,
      },
      (response) => {
        let read = 0;
        response.on("data", (chunk: Buffer) => {
          read += chunk.length;
          if (read > MAX_ANSWER_BYTES) response.destroy();
        });
        const finish = () => resolve(done(response.statusCode, ""));
        response.on("end", finish);
        response.on("close", finish);
        response.on("error", finish);
      },
    );
    request.on("error", (err) => resolve(done(undefined, abort.aborted && deadline.aborted ? `no answer within ${options.timeoutMs} ms` : err.message)));
    request.end(body);
  });
}

async function pickAddress(host: string, options: SendOptions, signal: AbortSignal): Promise<string> {
  const named = hostRefusal(host, options.allowLoopback);
  if (named) throw new Error(`refused: ${named}`);
  const addresses = net.isIP(host) !== 0 ? [host] : await raceAbort(options.resolve(host), signal);
  if (addresses.length === 0) throw new Error(`${host} has no address`);
  for (const address of addresses) {
    const refusal = refusalOf(address, options.allowLoopback);
    if (refusal) throw new Error(`refused: ${host} resolves to ${refusal}`);
  }
  return addresses[0]!;
}

function raceAbort<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    if (signal.aborted) return reject(new Error("timed out resolving"));
    signal.addEventListener("abort", () => reject(new Error("timed out resolving")), { once: true });
    promise.then(resolve, reject);
  });
}
