import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { AccountService, type ApiKey } from "../../gen/typesafe/account/v1/account_service_pb.js";

/** The account area's RPCs, as the generated client calls them. */
export type AccountClient = Client<typeof AccountService>;

/**
 * The generated Connect client on this page's own origin. The session is the
 * HttpOnly cookie the browser sends by itself on same-origin requests; the
 * page never holds a credential of its own.
 */
export function createAccountClient(origin: string): AccountClient {
  return createClient(AccountService, createConnectTransport({ baseUrl: origin }));
}

/** True when the service says there is no valid session (never signed in, signed out, expired). */
/** Every key of the account, page by page (the service pages ListKeys). */
export async function listAllKeys(client: AccountClient): Promise<ApiKey[]> {
  const keys: ApiKey[] = [];
  let pageToken = "";
  do {
    const page = await client.listKeys({ pageSize: 500, pageToken });
    keys.push(...page.keys);
    pageToken = page.nextPageToken;
  } while (pageToken !== "");
  return keys;
}

export function isSignedOut(err: unknown): boolean {
  return ConnectError.from(err).code === Code.Unauthenticated;
}

/** A sentence for the reader: the service's own message, and when to retry if it throttled. */
export function errorText(err: unknown): string {
  const error = ConnectError.from(err);
  if (error.code === Code.Unavailable || error.code === Code.Unknown) return "The service could not be reached. Try again in a moment.";
  const retryAfter = error.metadata.get("retry-after");
  const message = error.rawMessage || "Something went wrong.";
  return retryAfter ? `${message} Try again in ${retryAfter} seconds.` : message;
}
