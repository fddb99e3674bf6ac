import crypto from "node:crypto";
import { Transform, type Readable, type TransformCallback } from "node:stream";
import zlib from "node:zlib";
import { toJson } from "@bufbuild/protobuf";
import { createContextValues } from "@connectrpc/connect";
import busboy from "busboy";
import type { Knex } from "knex";
import { apiError, describeError } from "../errors.js";
import { createEvaluationFromFile, evaluationMessage } from "../evaluation/evaluations.js";
import { MAX_EXAMPLES_FILE_BYTES } from "../evaluation/examples.js";
import type { DbEvaluationRow } from "../evaluation/store.js";
import { sendError, sendOk, type NodeRequest, type NodeResponse } from "../http/envelope.js";
import { CreateEvaluationRequestSchema, EvaluationSchema } from "../gen/typesafe/account/v1/account_service_pb.js";
import { bodyCancelled, drainNodeBody, payloadTooLarge } from "../http/body.js";
import { ACCEPTED_ENCODING_NAMES, compressionNamed, undecompressable, unsupportedEncoding } from "../http/compression.js";
import { decodeJsonRequest } from "../http/json-body.js";
import { requestHeaders } from "../http/node-headers.js";
import { observeCall, type CallObserver } from "../call/observe.js";
import { allowedMember } from "./access.js";
import { kMember, openAccountDoor, type AccountDoorOptions } from "./door.js";
import { creditsToUnits } from "./evaluations.js";

/** Where an examples file is uploaded: CreateEvaluation with a JSON Lines or CSV file in place of the examples list. */
export const EVALUATION_UPLOAD_PATH = "/account/v1/evaluations/upload";

/**
 * Uploads read at once in this process. A file's examples are held until their one transaction
 * (up to the body bound each), so this bounds what uploads can hold together.
 */
export const UPLOADS_AT_ONCE = 2;
/** How long a refused upload is told to wait: an upload of the largest file takes about this long. */
const UPLOADS_BUSY_RETRY_SECONDS = 10;

/** The form fields the upload reads besides the file; each at most the JSON body limit. */
const FIELDS = ["name", "questions", "credit_cap_credits", "examples_in_flight"] as const;
type FieldName = (typeof FIELDS)[number];

export interface EvaluationUploadDeps {
  db: Knex;
  door: AccountDoorOptions;
  observer: CallObserver;
  /** The JSON body limit: the bound of each form field, and how much of a refused body is read before the connection is closed. */
  maxBodyBytes: number;
  wakeRunner: () => void;
}

/**
 * POST /account/v1/evaluations/upload, multipart/form-data: the fields of
 * CreateEvaluation (`name`, `questions` as JSON, `credit_cap_credits`,
 * `examples_in_flight`) and then one file part `examples` (`.jsonl` or
 * `.csv`). The same door as the RPCs (origin, session cookie), the
 * `run_evaluations` role, the member's account.
 *
 * It streams: the file is parsed a line at a time as it arrives, and only
 * the parsed examples are held (the raw text never is), up to
 * MAX_EXAMPLES_FILE_BYTES of body, counted before and after decompression
 * (gzip or br, as on the other doors). Every bad line is named with its number
 * and field; nothing is stored unless every line and example passes.
 */
export function createEvaluationUploadHandler(deps: EvaluationUploadDeps) {
  let uploadsReading = 0;
  return (req: NodeRequest, res: NodeResponse): void => {
    const requestId = crypto.randomUUID();
    const headers: Record<string, string> = { "x-request-id": requestId, "cache-control": "no-store" };
    let reading = false;
    void observeCall(deps.observer, { requestId, procedure: EVALUATION_UPLOAD_PATH, protocol: "gateway" }, async () => {
      if (req.method !== "POST") throw apiError("METHOD_NOT_ALLOWED", `${EVALUATION_UPLOAD_PATH} accepts POST`, { metadata: { allow: "POST" } });
      const values = createContextValues();
      await openAccountDoor(deps.door, { methodName: "UploadEvaluation", header: requestHeaders(req), values });
      const member = allowedMember(values.get(kMember)!, "run_evaluations");
      const contentType = req.headers["content-type"] ?? "";
      if (!/^multipart\/form-data\s*;/i.test(contentType)) {
        throw apiError("UNSUPPORTED_MEDIA_TYPE", "content-type: must be multipart/form-data", { field: "content-type", rule: "must be multipart/form-data" });
      }
      const encoding = req.headers["content-encoding"];
      const compression = compressionNamed(encoding);
      if (compression === undefined) throw unsupportedEncoding(String(encoding), "content-encoding", "accept-encoding");
      if (Number(req.headers["content-length"] ?? NaN) > MAX_EXAMPLES_FILE_BYTES) throw payloadTooLarge(MAX_EXAMPLES_FILE_BYTES);
      if (uploadsReading >= UPLOADS_AT_ONCE) {
        throw apiError("UPLOADS_BUSY", `${UPLOADS_AT_ONCE} uploads are being read: try again in ${UPLOADS_BUSY_RETRY_SECONDS} s`, {
          metadata: { retry_after_seconds: String(UPLOADS_BUSY_RETRY_SECONDS) },
        });
      }
      uploadsReading += 1;
      reading = true;
      const row = await receive(req, contentType, compression?.name, deps.maxBodyBytes, (fields, file, format) =>
        createEvaluationFromFile(deps.db, {
          accountId: member.accountId,
          createdBy: member.email,
          name: fields.name,
          questions: fields.questions,
          file,
          format,
          capUnits: creditsToUnits(fields.creditCapCredits),
          examplesInFlight: fields.examplesInFlight,
          at: deps.door.now(),
        }),
      );
      deps.wakeRunner();
      return { evaluation: toJson(EvaluationSchema, evaluationMessage(row), { useProtoFieldName: true, alwaysEmitImplicit: true }) };
    })
      .then((data) => sendOk(res, data, headers))
      .catch((err: unknown) => {
        if (req.method !== "POST") res.setHeader("allow", "POST");
        if (describeError(err).reason === "UNSUPPORTED_ENCODING") headers["accept-encoding"] = ACCEPTED_ENCODING_NAMES;
        sendError(res, err, headers);
      })
      .finally(() => {
        if (reading) uploadsReading -= 1;
        // Whatever of the body was not read is read and thrown away (bounded), so the answer reaches a client still sending.
        if (!req.readableEnded) {
          if (reading) req.unpipe();
          drainNodeBody(req, res, deps.maxBodyBytes);
        }
      });
  };
}

type UploadFields = ReturnType<typeof decodeFields>;

/**
 * Reads the form: the fields first, then the examples file, which `store`
 * parses as it arrives. A body past the bound (before or after inflating)
 * fails the file's parse with 413, so nothing is stored.
 */
function receive(
  req: NodeRequest,
  contentType: string,
  encoding: string | undefined,
  maxFieldBytes: number,
  store: (fields: UploadFields, file: Readable, format: "jsonl" | "csv") => Promise<DbEvaluationRow>,
): Promise<DbEvaluationRow> {
  return new Promise((resolve, reject) => {
    const form = busboy({
      headers: { "content-type": contentType },
      limits: { fields: FIELDS.length, fieldSize: maxFieldBytes, files: 1, fileSize: MAX_EXAMPLES_FILE_BYTES, parts: FIELDS.length + 1 },
    });
    const fields = new Map<FieldName, string>();
    let file: Readable | undefined;
    let done = false;
    const fail = (err: unknown) => {
      if (done) return;
      if (file) return void file.destroy(err as Error);
      done = true;
      reject(err);
    };
    const raw = byteBound(() => fail(payloadTooLarge(MAX_EXAMPLES_FILE_BYTES)));
    const inflater = encoding === undefined ? undefined : encoding === "gzip" ? zlib.createGunzip() : zlib.createBrotliDecompress();
    const inflated = byteBound(() => fail(payloadTooLarge(MAX_EXAMPLES_FILE_BYTES)));
    req.on("error", fail);
    req.on("close", () => {
      if (!req.readableEnded) fail(bodyCancelled());
    });
    raw.on("error", fail);
    inflater?.on("error", () => fail(undecompressable(encoding!)));
    form.on("error", () => fail(apiError("INVALID_ARGUMENT", "body: not a valid multipart/form-data body", { field: "body", rule: "multipart/form-data (RFC 7578)" })));
    form.on("field", (name, value, info) => {
      if (file) return;
      if (!(FIELDS as readonly string[]).includes(name)) return fail(partError(name, `not a field of the upload (${FIELDS.join(", ")}, then the examples file)`));
      if (fields.has(name as FieldName)) return fail(fieldError(name, "given once"));
      if (info.valueTruncated) return fail(fieldError(name, `at most ${maxFieldBytes} bytes`));
      fields.set(name as FieldName, value);
    });
    form.on("file", (name, stream, info) => {
      if (file || done) return void stream.resume();
      if (name !== "examples") {
        stream.resume();
        return fail(partError(name, FIELDS.includes(name as FieldName) ? "a form field, not a file" : "not a field of the upload: the file part is examples"));
      }
      const format = formatOf(info.filename, info.mimeType);
      if (!format) {
        stream.resume();
        return fail(fieldError("examples", "a .jsonl (JSON Lines) or .csv file"));
      }
      let decoded: UploadFields;
      try {
        decoded = decodeFields(fields);
      } catch (err) {
        stream.resume();
        return fail(err);
      }
      file = stream;
      stream.on("limit", () => stream.destroy(payloadTooLarge(MAX_EXAMPLES_FILE_BYTES)));
      store(decoded, stream, format).then(
        (row) => {
          done = true;
          resolve(row);
        },
        (err: unknown) => {
          done = true;
          stream.resume();
          reject(err);
        },
      );
    });
    form.on("close", () => {
      if (!file) fail(fieldError("examples", "required: a .jsonl or .csv file part, after the other fields"));
    });
    const source = raw;
    req.pipe(raw);
    if (inflater) source.pipe(inflater).pipe(inflated).pipe(form);
    else source.pipe(form);
  });
}

/** A pass-through that calls `over` once its bytes pass the upload bound (the rest is dropped). */
function byteBound(over: () => void): Transform {
  let total = 0;
  return new Transform({
    transform(chunk: Buffer, _encoding, callback: TransformCallback) {
      total += chunk.byteLength;
      if (total > MAX_EXAMPLES_FILE_BYTES) {
        over();
        return callback();
      }
      callback(null, chunk);
    },
  });
}

/** The file's format, by its name, then by its type. */
function formatOf(filename: string | undefined, mimeType: string): "jsonl" | "csv" | undefined {
  const name = (filename ?? "").toLowerCase();
  if (name.endsWith(".csv") || mimeType === "text/csv") return "csv";
  if (name.endsWith(".jsonl") || name.endsWith(".ndjson") || mimeType === "application/jsonl" || mimeType === "application/x-ndjson") return "jsonl";
  return undefined;
}

/** The fields as CreateEvaluation reads them, through its JSON schema: the same rules and field names as the RPC. */
function decodeFields(fields: Map<FieldName, string>) {
  const questionsText = fields.get("questions");
  if (questionsText === undefined) throw fieldError("questions", "required, before the examples file");
  let questions: unknown;
  try {
    questions = JSON.parse(questionsText);
  } catch {
    throw fieldError("questions", "a JSON object of question key to question, as a decision takes them");
  }
  const json: Record<string, unknown> = { questions };
  for (const name of ["name", "credit_cap_credits", "examples_in_flight"] as const) {
    const value = fields.get(name);
    if (value !== undefined && value !== "") json[name] = value;
  }
  const request = decodeJsonRequest(CreateEvaluationRequestSchema, json);
  return { name: request.name, questions: request.questions, creditCapCredits: request.creditCapCredits, examplesInFlight: request.examplesInFlight };
}

/**
 * A part the upload does not read: named by its own name when that is a plain word, else as a part
 * of the body (busboy gives an empty name as undefined, and an odd name is no field to point at).
 */
function partError(name: string | undefined, rule: string) {
  return name !== undefined && /^[A-Za-z0-9_.-]{1,64}$/.test(name) ? fieldError(name, rule) : fieldError("body", `a form part without a plain name: ${rule}`);
}

function fieldError(field: string, rule: string) {
  return apiError("INVALID_ARGUMENT", `${field}: ${rule}`, { field, rule });
}
