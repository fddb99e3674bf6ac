import { AccountService } from "../gen/typesafe/account/v1/account_service_pb.js";

/**
 * Sent with every answer of the account area's API, refusals included, on
 * every protocol: never sniffed as another type, never framed, no Referer
 * (an invite token may be in the page's address), and never cached, since
 * each holds an account's data or a session's refusal. The page's own files
 * carry their headers in web/account-page.ts.
 */
export const ACCOUNT_API_HEADERS: Readonly<Record<string, string>> = {
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "content-security-policy": "default-src 'none'; frame-ancestors 'none'",
  "cache-control": "no-store",
};

const RPC_PREFIX = `/${AccountService.typeName}/`;
const JSON_PREFIX = "/account/v1/";

/** True for a path of the account area's API: its RPCs (Connect, gRPC-Web, gRPC) and its JSON paths, the CSV included. */
export function isAccountApiPath(path: string): boolean {
  return path.startsWith(RPC_PREFIX) || path.startsWith(JSON_PREFIX);
}

/** The headers an answer to this request path must carry before anything else is written, or undefined. */
export function answerHeadersFor(path: string): Readonly<Record<string, string>> | undefined {
  return isAccountApiPath(path) ? ACCOUNT_API_HEADERS : undefined;
}
