import { fromJson, ScalarType, toBinary, type DescField, type DescMessage, type DescMethod, type JsonValue } from "@bufbuild/protobuf";
import fc from "fast-check";
import type { Knex } from "knex";
import { createInvite } from "../../src/team/invites.js";
import { ensureMember } from "../../src/team/members.js";
import { httpBindingOf } from "../../src/http/http-bindings.js";
import { AccountService } from "../../src/gen/typesafe/account/v1/account_service_pb.js";
import { createTestAccount } from "../support/app.js";
import { callConnect, callGrpc } from "../support/wire.js";
import { problemOf, type Verdict } from "./cases.js";

/**
 * Fuzz cases of the account area: every AccountService method with its JSON
 * path, and the usage CSV's query. Bodies are built from each request's
 * schema (so every field is reached), filled with odd text (U+0000, lone
 * surrogates, long and empty strings) and odd numbers, then mutated as the
 * API's cases are. Calls carry an owner's session, so they get past the door.
 */
const ODD_TEXT = [
  "",
  " ",
  "a\u0000b",
  "a\u0000b@example.com",
  "\u0000",
  "\udc00",
  "x\ud800@example.com",
  "__proto__",
  "%00",
  "9".repeat(40),
  "someone@example.com",
  "https://example.com/hook",
  "http://localhost./",
  "http://127.0.0.1:1/",
  "decide",
  "owner",
  "viewer",
  "day",
  "month",
  "5e-324",
  "0.000001",
  "00000000-0000-4000-8000-000000000000",
  "-271821-04-20T00:00:00Z",
  "🙂".repeat(300),
];
const text = fc.oneof(fc.string({ maxLength: 40 }), fc.constantFrom(...ODD_TEXT));
const timestamp = fc.oneof(
  fc.integer({ min: -62_135_596_800_000, max: 253_402_300_799_000 }).map((ms) => new Date(ms).toISOString()),
  text,
);

function scalarValue(scalar: ScalarType): fc.Arbitrary<unknown> {
  switch (scalar) {
    case ScalarType.STRING:
      return text;
    case ScalarType.BOOL:
      return fc.oneof(fc.boolean(), text);
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return fc.oneof(fc.double({ noNaN: true, noDefaultInfinity: true }), fc.constantFrom(5e-324, 1e308, -1, 0.0000005, "NaN", "Infinity"), text);
    case ScalarType.INT64:
    case ScalarType.UINT64:
    case ScalarType.SINT64:
    case ScalarType.FIXED64:
    case ScalarType.SFIXED64:
      return fc.oneof(fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n }).map(String), fc.constantFrom("18446744073709551616", "-1", "1e3"));
    case ScalarType.BYTES:
      return fc.oneof(fc.base64String({ maxLength: 24 }), text);
    default:
      return fc.oneof(fc.integer(), fc.constantFrom(2 ** 31, -(2 ** 31) - 1, 2 ** 53, -1, 0.5));
  }
}

function fieldValue(field: DescField, depth: number): fc.Arbitrary<unknown> {
  const one = (): fc.Arbitrary<unknown> => {
    switch (field.fieldKind) {
      case "scalar":
        return scalarValue(field.scalar);
      case "enum":
        return fc.oneof(fc.constantFrom(...field.enum.values.map((v) => v.name)), fc.integer(), text);
      case "message":
        return messageValue(field.message, depth + 1);
      case "list":
        return fc.array(field.listKind === "message" ? messageValue(field.message, depth + 1) : field.listKind === "enum" ? text : scalarValue(field.scalar), { maxLength: 4 });
      case "map":
        return fc.dictionary(text, field.mapKind === "message" ? messageValue(field.message, depth + 1) : field.mapKind === "enum" ? text : scalarValue(field.scalar), { maxKeys: 3 });
    }
  };
  return one();
}

function messageValue(schema: DescMessage, depth: number): fc.Arbitrary<unknown> {
  if (schema.typeName === "google.protobuf.Timestamp") return timestamp;
  if (depth > 3) return fc.constant({});
  const fields = Object.fromEntries(schema.fields.map((field) => [field.name, fieldValue(field, depth)]));
  return fc.record(fields, { requiredKeys: [] });
}

/** The account area's methods with their JSON path, as the gateway serves them. */
const ACCOUNT_METHODS = AccountService.methods.flatMap((method) => {
  const binding = httpBindingOf(method);
  return binding ? [{ method, ...binding }] : [];
});

export interface AccountCase {
  method: DescMethod;
  httpMethod: "GET" | "POST";
  path: string;
  body: string;
}

/** A body for one account method: its schema's fields with odd values, sometimes a field removed, replaced by any JSON, or added. */
export const accountCase: fc.Arbitrary<AccountCase> = fc
  .constantFrom(...ACCOUNT_METHODS)
  .chain(({ method, httpMethod, path }) =>
    fc.tuple(messageValue(method.input, 0), fc.nat(3), fc.jsonValue({ maxDepth: 2 }), text).map(([generated, mutation, anyJson, key]) => {
      const body = { ...(generated as Record<string, unknown>) };
      const keys = method.input.fields.map((f) => f.name);
      const target = keys.length > 0 ? keys[key.length % keys.length]! : key;
      if (mutation === 1) delete body[target];
      if (mutation === 2) body[target] = anyJson;
      if (mutation === 3) body[key] = anyJson;
      return { method, httpMethod, path, body: JSON.stringify(body) };
    }),
  );

/** The usage CSV's query: its four parameters with odd values, repeated or missing. */
export const csvCase = fc
  .array(fc.tuple(fc.constantFrom("endpoint", "key_id", "since", "until", "x"), fc.oneof(text, timestamp)), { maxLength: 5 })
  .map((pairs) => new URLSearchParams(pairs).toString());

/** One part of an examples upload: a form field or a file, under any name. */
interface UploadPart {
  name: string;
  value: string;
  filename?: string;
}

const EXAMPLE_LINE = fc.oneof(
  fc.constant('{"state":"s","labels":{"q":true}}'),
  fc.constant('state,q\ns,true'),
  fc.jsonValue({ maxDepth: 2 }).map((v) => JSON.stringify(v)),
  text,
);

/**
 * The examples upload's multipart form: its four fields and the examples file with odd values,
 * in any order, repeated, missing, under other names or other file names; sometimes a body
 * that is not multipart at all behind a multipart content type.
 */
export const uploadCase: fc.Arbitrary<{ parts: UploadPart[]; broken?: string }> = fc.oneof(
  {
    arbitrary: fc
      .array(
        fc.oneof(
          fc.record({
            name: fc.oneof(fc.constantFrom("name", "questions", "credit_cap_credits", "examples_in_flight"), text),
            value: fc.oneof(text, fc.constantFrom('{"q":{"type":"noul","instructions":"Is it?"}}', "1", "0.5", "-1", "1e400", "5e-324"), fc.jsonValue({ maxDepth: 2 }).map((v) => JSON.stringify(v))),
          }),
          fc.record({
            name: fc.oneof(fc.constant("examples"), text),
            value: fc.array(EXAMPLE_LINE, { maxLength: 4 }).map((lines) => lines.join("\n")),
            filename: fc.oneof(fc.constantFrom("examples.jsonl", "examples.csv", "examples.ndjson", "examples.txt", ""), text),
          }),
        ),
        { maxLength: 6 },
      )
      .map((parts) => ({ parts })),
    weight: 4,
  },
  { arbitrary: text.map((broken) => ({ parts: [], broken })), weight: 1 },
);

/** Sends one upload case with the session cookie and the page's own origin. */
export async function sendUpload(baseUrl: string, cookie: string, c: { parts: UploadPart[]; broken?: string }): Promise<Verdict> {
  const headers: Record<string, string> = { cookie, origin: baseUrl };
  let body: FormData | string;
  if (c.broken !== undefined) {
    headers["content-type"] = "multipart/form-data; boundary=fuzz";
    body = c.broken;
  } else {
    body = new FormData();
    for (const part of c.parts) {
      if (part.filename === undefined) body.append(part.name, part.value);
      else body.append(part.name, new Blob([part.value]), part.filename);
    }
  }
  const response = await fetch(`${baseUrl}/account/v1/evaluations/upload`, { method: "POST", headers, body });
  return envelopeVerdict("upload", response.status, await response.text());
}

/** An owner of a fresh account, signed in through the JSON path: the session cookie the account cases carry. */
export async function signedInOwner(baseUrl: string, db: Knex): Promise<{ cookie: string; email: string }> {
  const { accountId } = await createTestAccount(db, { units: 1_000_000, name: "fuzz" });
  const email = `owner-${Math.random().toString(36).slice(2, 10)}@example.com`;
  const token = await db.transaction(async (tx) => {
    const member = await ensureMember(tx, accountId, email, "owner");
    return (await createInvite(tx, member!.id, new Date())).token;
  });
  const response = await fetch(`${baseUrl}/account/v1/invites/accept`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ invite_token: token, password: "fuzzing owner's long password 7" }),
  });
  const cookie = response.headers.getSetCookie().map((line) => line.split(";", 1)[0]!).join("; ");
  if (response.status !== 200 || cookie === "") throw new Error(`the fuzz owner could not sign in: ${response.status} ${await response.text()}`);
  return { cookie, email };
}

/**
 * Sends one account case to the gateway's JSON path and to Connect JSON, and
 * when the body is a valid message also as binary gRPC. SignOut goes without
 * the cookie, so the session the other cases need lives on.
 */
export async function sendAccount(baseUrl: string, cookie: string, c: AccountCase): Promise<Verdict[]> {
  const headers: Record<string, string> = c.method.name === AccountService.method.signOut.name ? {} : { cookie };
  const verdicts: Verdict[] = [];
  const gatewayUrl = c.httpMethod === "GET" ? `${baseUrl}${c.path}?${queryOf(c.body)}` : `${baseUrl}${c.path}`;
  const gateway = await fetch(gatewayUrl, {
    method: c.httpMethod,
    headers: { ...headers, ...(c.httpMethod === "POST" ? { "content-type": "application/json" } : {}) },
    body: c.httpMethod === "POST" ? c.body : undefined,
  });
  verdicts.push(envelopeVerdict("gateway", gateway.status, await gateway.text()));
  const rpcPath = `/${AccountService.typeName}/${c.method.name}`;
  const connect = await callConnect(baseUrl, rpcPath, c.body, { headers });
  verdicts.push({ surface: "connect-json", status: connect.status, reason: connect.reason, field: connect.field, problem: problemOf({ ...connect, grpc: false, text: JSON.stringify({ ...connect, body: undefined }) }) });
  const message = decoded(c.method.input, c.body);
  if (message) {
    const grpc = await callGrpc(baseUrl, rpcPath, message, { headers });
    verdicts.push({ surface: "grpc", status: grpc.status, reason: grpc.reason, field: grpc.field, problem: problemOf({ ...grpc, grpc: true, text: JSON.stringify({ ...grpc, body: undefined }) }) });
  }
  return verdicts;
}

/** Sends one CSV query with the session cookie. */
export async function sendCsv(baseUrl: string, cookie: string, query: string): Promise<Verdict> {
  const response = await fetch(`${baseUrl}/account/v1/usage.csv?${query}`, { headers: { cookie } });
  const body = await response.text();
  if (response.status === 200) return { surface: "csv", status: 200, problem: problemOf({ status: 200, grpc: false, text: body.slice(0, 2000) }) };
  return envelopeVerdict("csv", response.status, body);
}

function envelopeVerdict(surface: string, status: number, body: string): Verdict {
  let data: { reason?: string; field?: string } = {};
  try {
    data = (JSON.parse(body) as { data?: typeof data }).data ?? {};
  } catch {
    // Not our envelope: no reason, which problemOf reports.
  }
  // A 200 may rightly carry a key's secret (CreateKey): only refusals are searched for leaks.
  const text = status === 200 ? "" : body;
  return { surface, status, reason: data.reason, field: data.field, problem: problemOf({ status, grpc: false, reason: data.reason, field: data.field, text }) };
}

/** A GET path's query: the body's top-level scalars as parameters. */
function queryOf(body: string): string {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(JSON.parse(body) as Record<string, unknown>)) {
    if (typeof value !== "object" || value === null) params.append(name, String(value));
  }
  return params.toString();
}

function decoded(schema: DescMessage, body: string): Uint8Array | undefined {
  try {
    return toBinary(schema, fromJson(schema, JSON.parse(body) as JsonValue));
  } catch {
    return undefined;
  }
}
