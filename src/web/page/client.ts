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

/** Bytes of the upload's body sent so far, of its total. */
export interface UploadProgress {
  sentBytes: number;
  totalBytes: number;
}

/**
 * Starts an evaluation from a form of its fields and an examples file (JSON
 * Lines or CSV), streamed to the upload route with the session cookie the
 * browser sends by itself. XMLHttpRequest, not fetch: only its `upload`
 * events say how much of the body has been sent, which `onProgress` hears.
 * A refusal is a ConnectError whose message is the service's, each bad line
 * on a line of its own.
 */
export function uploadEvaluation(origin: string, form: FormData, onProgress?: (progress: UploadProgress) => void): Promise<Evaluation> {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", new URL(EVALUATION_UPLOAD_PATH, origin));
    xhr.responseType = "text";
    // Listened to before send(): a listener added later may miss every event of the upload.
    xhr.upload.addEventListener("progress", (event) => {
      if (event.lengthComputable) onProgress?.({ sentBytes: event.loaded, totalBytes: event.total });
    });
    const unreached = () => reject(new ConnectError("the upload did not reach the service", Code.Unavailable));
    xhr.addEventListener("error", unreached);
    xhr.addEventListener("abort", unreached);
    xhr.addEventListener("load", () => {
      try {
        resolve(evaluationOfAnswer(xhr.status, xhr.responseText));
      } catch (err) {
        reject(err);
      }
    });
    xhr.send(form);
  });
}

/** The upload route's envelope as the evaluation it started, or as the ConnectError the page's error handling reads. */
function evaluationOfAnswer(status: number, text: string): Evaluation {
  let envelope: { message?: string; data?: { evaluation?: JsonValue; metadata?: Record<string, string> } } | undefined;
  try {
    envelope = JSON.parse(text) as typeof envelope;
  } catch {
    envelope = undefined;
  }
  if (status >= 200 && status < 300 && envelope?.data?.evaluation) return fromJson(EvaluationSchema, envelope.data.evaluation, { ignoreUnknownFields: true });
  const violations = envelope?.data?.metadata?.["violations"];
  const more = Number(envelope?.data?.metadata?.["more_violations"] ?? 0);
  const listed = violations && violations.includes("\n") ? `\n${violations}${more > 49 ? `\n… and ${more - 49} more` : ""}` : "";
  throw new ConnectError(`${envelope?.message ?? `the upload failed (HTTP ${status})`}${listed}`, CODE_OF_STATUS[status] ?? Code.Unknown);
}
