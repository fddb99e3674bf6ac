import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { fromJson, type JsonValue } from "@bufbuild/protobuf";
import { AccountService, EvaluationSchema, type ApiKey, type Evaluation } from "../../gen/typesafe/account/v1/account_service_pb.js";

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

/** True when the service says there is no valid session (never signed in, signed out, expired). */
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

/** The path of the streamed examples upload (a plain HTTP route beside the RPCs, as usage.csv is). */
export const EVALUATION_UPLOAD_PATH = "/account/v1/evaluations/upload";

/** The gateway's HTTP status as the Connect code the page's error handling reads (the envelope's message is kept). */
const CODE_OF_STATUS: Record<number, Code> = {
  400: Code.InvalidArgument,
  401: Code.Unauthenticated,
  403: Code.PermissionDenied,
  404: Code.NotFound,
  409: Code.FailedPrecondition,
  413: Code.ResourceExhausted,
  415: Code.InvalidArgument,
  429: Code.ResourceExhausted,
  503: Code.Unavailable,
};

/**
 * Starts an evaluation from a form of its fields and an examples file (JSON
 * Lines or CSV), streamed to the upload route with the session cookie the
 * browser sends by itself. A refusal is a ConnectError whose message is the
 * service's, each bad line on a line of its own.
 */
export async function uploadEvaluation(origin: string, form: FormData): Promise<Evaluation> {
  let response: Response;
  try {
    response = await fetch(new URL(EVALUATION_UPLOAD_PATH, origin), { method: "POST", body: form, credentials: "same-origin" });
  } catch (err) {
    throw new ConnectError("the upload did not reach the service", Code.Unavailable, undefined, undefined, err);
  }
  const envelope = (await response.json().catch(() => undefined)) as { message?: string; data?: { evaluation?: JsonValue; metadata?: Record<string, string> } } | undefined;
  if (response.ok && envelope?.data?.evaluation) return fromJson(EvaluationSchema, envelope.data.evaluation, { ignoreUnknownFields: true });
  const violations = envelope?.data?.metadata?.["violations"];
  const more = Number(envelope?.data?.metadata?.["more_violations"] ?? 0);
  const listed = violations && violations.includes("\n") ? `\n${violations}${more > 49 ? `\n… and ${more - 49} more` : ""}` : "";
  throw new ConnectError(`${envelope?.message ?? `the upload failed (HTTP ${response.status})`}${listed}`, CODE_OF_STATUS[response.status] ?? Code.Unknown);
}
