import fs from "node:fs";
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { MAX_KEY_LENGTH } from "../../src/decision/validate.js";
import { OPENAPI_DOCUMENT_PATH } from "../../src/openapi/served.js";
import { FINITE_RULE, PROTO_KEY_RULE, STORABLE_TEXT_RULE, UNICODE_RULE } from "../../src/validation.js";
import { addServiceOrigin, installChecker, isServiceUrl } from "./openapi-origins.js";

/**
 * Every exchange the test suite has with the gateway is checked against the
 * committed OpenAPI document (src/gen/openapi.json), both ways:
 *
 * - the answer: its status must be a documented response of the operation,
 *   its body must validate against that response's schema, and its required
 *   headers must be there;
 * - the request: the document and the service must agree on it. A request the
 *   document refuses (body schema, content type, a required header, the key)
 *   must not be served, and one it accepts must not be refused for its shape,
 *   unless the refusal is one of the rules the document states only in words
 *   (UNEXPRESSED_RULES). A request both refuse, such as bad JSON, a wrong
 *   content type or an oversized body, is fine.
 *
 * The vitest setup file openapi-conformance.setup.ts feeds every exchange of
 * fetch and node:http here and fails a test that had a disagreement. This
 * module has no vitest hooks, so scripts (npm run fuzz) can use the test
 * helpers that register origins. Only exchanges with registered service
 * origins are checked (the fakes of the providers have paths of their own),
 * and only to paths the document describes: the same port also serves
 * Connect, gRPC, /metrics and the document itself.
 */
type Operation = {
  security?: Record<string, string[]>[];
  parameters?: ({ $ref: string } | DocumentedParameter)[];
  requestBody?: { required?: boolean; content: Record<string, { schema: object }> };
  responses: Record<string, DocumentedResponse | { $ref: string }>;
};
type DocumentedParameter = { name: string; in: string; required?: boolean; schema: object };
type DocumentedResponse = { headers?: Record<string, { required?: boolean; schema: object }>; content?: Record<string, { schema: object }> };
type SecurityScheme = { type: string; scheme?: string; in?: string; name?: string };
type OpenApiDocument = {
  paths: Record<string, Record<string, Operation>>;
  components: { responses: Record<string, DocumentedResponse>; parameters: Record<string, DocumentedParameter>; securitySchemes: Record<string, SecurityScheme> };
};

const document = JSON.parse(fs.readFileSync(OPENAPI_DOCUMENT_PATH, "utf8")) as OpenApiDocument;
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats.default(ajv);
ajv.addSchema(document, "openapi.json");
const validators = new Map<string, ValidateFunction>();

const violations: string[] = [];
let checkedAnswers = 0;
let checkedRequests = 0;

/** Exchanges with this origin (a test's service) are checked from now on. */
export function checkAnswersOf(url: string): void {
  addServiceOrigin(url);
}

export { isServiceUrl };

/** True when the document describes this path (a query string aside). */
export function isDocumentedPath(path: string): boolean {
  return path.split("?")[0]! in document.paths;
}

/** How many answers have been checked in this test file. */
export function checkedAnswerCount(): number {
  return checkedAnswers;
}

/** How many requests have been held against the document in this test file. */
export function checkedRequestCount(): number {
  return checkedRequests;
}

/** One request as a test sent it; `body` is undefined when it could not be read back. */
export interface SentRequest {
  method: string;
  url: string;
  headers: Headers;
  body: Buffer | undefined;
}

/** One answer as a test received it. */
export interface ReceivedAnswer {
  status: number;
  headers: Headers;
  body: string;
}

/** Checks one exchange with a registered service origin, answer and request, and keeps what disagrees. */
export function recordExchange(request: SentRequest, answer: ReceivedAnswer): void {
  const url = new URL(request.url);
  if (!isServiceUrl(url)) return;
  checkedAnswers++;
  violations.push(...violationsOf(request.method, url.pathname, answer.status, answer.headers, answer.body));
  const problems = requestViolationsOf(request, answer);
  if (problems !== undefined) {
    checkedRequests++;
    violations.push(...problems);
  }
}

/** The violations found since the last call, and forgets them. */
export function takeViolations(): string[] {
  return violations.splice(0);
}

/** What is wrong with one answer, by the document; empty when it conforms or the path is not documented. */
export function violationsOf(method: string, path: string, status: number, headers: Headers, body: string): string[] {
  const operation = document.paths[path]?.[method.toLowerCase()];
  if (!operation) return []; // 404 and 405 answers are to paths and methods the document does not have
  const where = `${method} ${path} → ${status}`;
  const declared = operation.responses[String(status)];
  if (!declared) return [`${where}: status not documented`];
  const response = "$ref" in declared ? document.components.responses[lastSegment(declared.$ref)]! : declared;
  const problems: string[] = [];
  for (const [name, header] of Object.entries(response.headers ?? {})) {
    const value = headers.get(name);
    if (value === null) {
      if (header.required) problems.push(`${where}: header ${name} missing`);
      continue;
    }
    const validate = ajv.compile(header.schema);
    if (!validate(value)) problems.push(`${where}: header ${name}=${value} ${ajv.errorsText(validate.errors)}`);
  }
  const pointer = "$ref" in declared ? `#/components/responses/${lastSegment(declared.$ref)}` : `#/paths/${escape(path)}/${method.toLowerCase()}/responses/${status}`;
  const validate = validatorAt(`${pointer}/content/application~1json/schema`);
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch {
    return [...problems, `${where}: body is not JSON`];
  }
  if (!validate(json)) problems.push(`${where}: ${ajv.errorsText(validate.errors)} in ${body.slice(0, 300)}`);
  return problems;
}

/**
 * Why the document refuses a request, or undefined when it accepts it: the
 * operation must exist, the key must be sent as the security scheme says, the
 * documented headers must hold, and a body must have a documented content
 * type and validate against the body schema.
 */
export function documentRefusalOf(method: string, path: string, headers: Headers, body: Buffer | undefined): string | undefined {
  const operation = document.paths[path]?.[method.toLowerCase()];
  if (!operation) return `the document has no ${method} ${path}`;
  const security = operation.security ?? [];
  if (security.length > 0 && !security.some((requirement) => Object.keys(requirement).every((scheme) => sendsCredential(scheme, headers)))) {
    return Object.keys(security[0]!).map(missingCredential).join(", ");
  }
  for (const [index, entry] of (operation.parameters ?? []).entries()) {
    const parameter = "$ref" in entry ? document.components.parameters[lastSegment(entry.$ref)]! : entry;
    if (parameter.in !== "header") continue;
    const value = headers.get(parameter.name);
    if (value === null) {
      if (parameter.required) return `header ${parameter.name} missing`;
      continue;
    }
    const pointer = "$ref" in entry ? `#/components/parameters/${lastSegment(entry.$ref)}` : `#/paths/${escape(path)}/${method.toLowerCase()}/parameters/${index}`;
    const validate = validatorAt(`${pointer}/schema`);
    if (!validate(value)) return `header ${parameter.name}: ${ajv.errorsText(validate.errors)}`;
  }
  if (!operation.requestBody) return undefined;
  const mediaType = (headers.get("content-type") ?? "").split(";")[0]!.trim().toLowerCase();
  if (!(mediaType in operation.requestBody.content)) return `content type ${JSON.stringify(headers.get("content-type"))} is not documented`;
  if (body === undefined) return undefined;
  let json: unknown;
  try {
    json = JSON.parse(body.toString("utf8"));
  } catch {
    return "the body is not JSON";
  }
  const validate = validatorAt(`#/paths/${escape(path)}/${method.toLowerCase()}/requestBody/content/${escape(mediaType)}/schema`);
  return validate(json) ? undefined : `body: ${ajv.errorsText(validate.errors)}`;
}

/** Whether a request carries the credential a security scheme of the document names (its presence, not its validity). */
function sendsCredential(name: string, headers: Headers): boolean {
  const scheme = document.components.securitySchemes[name];
  if (scheme?.type === "http" && scheme.scheme === "bearer") return /^bearer\s+\S+\s*$/i.test(headers.get("authorization") ?? "");
  if (scheme?.type === "apiKey" && scheme.in === "cookie") {
    // Over https the cookie carries the __Host- prefix (the scheme's description says so).
    const names = [scheme.name, `__Host-${scheme.name}`];
    return (headers.get("cookie") ?? "").split(";").some((pair) => names.includes(pair.trim().split("=")[0]) && pair.trim().split("=")[1] !== "");
  }
  throw new Error(`the checker does not know the security scheme ${name}`);
}

function missingCredential(name: string): string {
  return document.components.securitySchemes[name]?.type === "http" ? "no Authorization: Bearer key" : `no ${name}`;
}

/** Reasons that refuse the request itself (its path, method, credentials, origin, content type, size or fields). */
const REQUEST_REFUSALS = new Set([
  "INVALID_ARGUMENT",
  "MALFORMED_JSON",
  "UNSUPPORTED_MEDIA_TYPE",
  "PAYLOAD_TOO_LARGE",
  "NOT_FOUND",
  "METHOD_NOT_ALLOWED",
  "UNAUTHENTICATED",
  "SIGNED_OUT",
  "CROSS_SITE_REFUSED",
]);

/** Reasons given only after every request rule passed: the account, the limits, the upstream, the deployment. */
const AFTER_VALIDATION = new Set([
  "INSUFFICIENT_BALANCE",
  "IDEMPOTENCY_IN_PROGRESS",
  "IDEMPOTENCY_MISMATCH",
  "RATE_LIMITED",
  "CONCURRENCY_LIMITED",
  "UPSTREAM_FAILED",
  "NOT_CONFIGURED",
  "KEY_EXPIRED",
  "KEY_SCOPE_DENIED",
  "KEY_BUDGET_EXCEEDED",
  "MODEL_NOT_READY",
  // The account area's: the password, the invite and the sign-in throttle are judged once the request's shape passed.
  "SIGN_IN_FAILED",
  "INVITE_INVALID",
  "SIGN_IN_THROTTLED",
  "PASSWORD_CHECKS_BUSY",
  "KEY_LIMIT_REACHED",
]);

interface ErrorDetailJson {
  reason?: string;
  field?: string;
  rule?: string;
  metadata?: Record<string, string>;
}

/**
 * Refusals a request the document accepts may still get: rules the document
 * states in words only (its description and each request schema's "Also
 * refused"), because JSON Schema cannot say them or cannot know them.
 */
const UNEXPRESSED_RULES: { why: string; applies: (detail: ErrorDetailJson, request: SentRequest) => boolean }[] = [
  { why: "which keys exist is the service's to know", applies: (d) => d.reason === "UNAUTHENTICATED" },
  { why: "which sessions are live is the service's to know", applies: (d) => d.reason === "SIGNED_OUT" },
  { why: "the calling page's origin is judged against the service's own", applies: (d) => d.reason === "CROSS_SITE_REFUSED" },
  { why: "which ids belong to the caller's account is the service's to know", applies: (d) => d.reason === "NOT_FOUND" && d.field !== undefined },
  { why: "page tokens are the service's own", applies: (d) => d.field === "page_token" },
  {
    why: "a key's limits are judged against the clock, the unit of money, each other and the account's own limits",
    applies: (d) =>
      /^limits\./.test(d.field ?? "") &&
      /^(must be in the future|a number of credits from 0, with at most 6 decimals|only with budget_credits|with a budget: .*|from 1 to the account's \d+, or 0 for the account's)$/.test(d.rule ?? ""),
  },
  {
    why: "a threshold's six decimals, and thresholds sent as strings, are told in words",
    applies: (d) => /^thresholds_credits\[\d+\]$/.test(d.field ?? "") && /with at most 6 decimals$/.test(d.rule ?? ""),
  },
  {
    why: "an amount's six decimals are told in words",
    applies: (d) => d.field === "credit_cap_credits" && /with at most 6 decimals$/.test(d.rule ?? ""),
  },
  { why: "a time range's ends are compared with each other", applies: (d) => d.field === "since" && /before until/.test(d.rule ?? "") },
  { why: "a password's strength is estimated (zxcvbn-ts)", applies: (d) => d.field === "password" && /^too easy to guess/.test(d.rule ?? "") },
  { why: "control characters in a sign-in email are refused", applies: (d) => d.field === "email" && /no control characters$/.test(d.rule ?? "") },
  { why: "times are held to the years 1 to 9999", applies: (d) => /^a time between the years/.test(d.rule ?? "") },
  { why: "key names are trimmed and control characters refused", applies: (d) => d.field === "name" && /no control characters$/.test(d.rule ?? "") },
  { why: "the body limit counts bytes", applies: (d, r) => d.reason === "PAYLOAD_TOO_LARGE" && (r.body === undefined || r.body.length > Number(d.metadata?.["max_bytes"])) },
  { why: "lone surrogates are valid JSON escapes", applies: (d) => d.rule === UNICODE_RULE },
  { why: "U+0000 and lone surrogates are valid JSON escapes; the account area stores none", applies: (d) => d.rule === STORABLE_TEXT_RULE },
  { why: "which codes are current is the authenticator's to know", applies: (d) => d.field === "code" && /^a current code/.test(d.rule ?? "") },
  { why: "one of two second factors, told in words", applies: (d) => d.rule === "exactly one of code and recovery_code" },
  { why: "an email's form is told in words", applies: (d) => d.field === "email" && d.rule === "an email address (name@domain)" },
  {
    why: "a webhook URL's scheme, parts and address are told in words",
    applies: (d) => d.field === "url" && /^must (be an absolute|be an http|not hold|not have a fragment|reach a public address)/.test(d.rule ?? ""),
  },
  { why: "query parameters arrive as text: the checker judges bodies and headers", applies: (_d, r) => r.method === "GET" },
  { why: "a __proto__ key may sit at any depth", applies: (d) => d.rule === PROTO_KEY_RULE },
  { why: "JSON numbers have no upper bound", applies: (d) => d.rule === FINITE_RULE },
  { why: "nesting depth of free-form JSON", applies: (d) => /^nesting deeper than \d+ levels$/.test(d.rule ?? "") },
  { why: "labels and options compared with whitespace collapsed", applies: (d) => /apart from whitespace$/.test(d.rule ?? "") },
  { why: "the prompt size depends on the tokenizer", applies: (d) => /^prompt at most \d+ tokens$/.test(d.rule ?? "") },
  { why: "which sources can filter by time depends on the deployment", applies: (d) => d.rule === "supported_by_sources" },
  { why: "which sources the filters leave depends on the deployment", applies: (d) => d.rule === "leaves_a_source" },
  {
    why: "domains are judged against the Public Suffix List and each other, codes against the ISO lists, safe search against the deployment's minimum",
    applies: (d) =>
      /^(x?d\[\d+\]|l|c|safe)$/.test(d.field ?? "") &&
      /(is a public suffix|not an IP address|is not a valid domain name|is listed twice|is also in d|lies inside|ISO 639-1 language code|ISO 3166-1 alpha-2 country code|on this deployment$)/.test(d.rule ?? ""),
  },
  {
    why: "key length counts UTF-16 code units, JSON Schema counts code points",
    applies: (d, r) => /^question keys must be/.test(d.rule ?? "") && questionKeys(r).some((key) => key.length > MAX_KEY_LENGTH && [...key].length <= MAX_KEY_LENGTH),
  },
];

/**
 * Where the document and the service disagree on a request; undefined when
 * the request cannot be judged (its path is not the document's, its body
 * could not be read back, or the answer says nothing about it: a cancelled
 * call, an internal error, a database outage).
 */
export function requestViolationsOf(request: SentRequest, answer: ReceivedAnswer): string[] | undefined {
  const { pathname } = new URL(request.url);
  if (!(pathname in document.paths)) return undefined;
  let detail: ErrorDetailJson = {};
  if (answer.status >= 300) {
    try {
      detail = ((JSON.parse(answer.body) as { data?: ErrorDetailJson }).data ?? {}) as ErrorDetailJson;
    } catch {
      return undefined;
    }
  }
  const served = answer.status < 300 || AFTER_VALIDATION.has(detail.reason ?? "");
  const refused = !served && REQUEST_REFUSALS.has(detail.reason ?? "");
  if (!served && !refused) return undefined;
  const operation = document.paths[pathname]?.[request.method.toLowerCase()];
  if (request.body === undefined && operation?.requestBody) return undefined;
  const refusal = documentRefusalOf(request.method, pathname, request.headers, request.body);
  const where = `${request.method} ${pathname} → ${answer.status}`;
  if (served && refusal !== undefined) return [`${where}: the service served a request the document refuses (${refusal}) in ${preview(request)}`];
  if (refused && refusal === undefined && !UNEXPRESSED_RULES.some((rule) => rule.applies(detail, request))) {
    return [`${where}: the document accepts a request the service refuses (${detail.reason} ${detail.field ?? ""}: ${detail.rule ?? ""}) in ${preview(request)}`];
  }
  return [];
}

function questionKeys(request: SentRequest): string[] {
  try {
    const json = JSON.parse(request.body?.toString("utf8") ?? "") as { questions?: unknown };
    return typeof json.questions === "object" && json.questions !== null ? Object.keys(json.questions) : [];
  } catch {
    return [];
  }
}

function preview(request: SentRequest): string {
  return request.body === undefined ? "(no body)" : request.body.toString("utf8").slice(0, 300);
}

function validatorAt(pointer: string): ValidateFunction {
  const ref = `openapi.json${pointer}`;
  let validate = validators.get(ref);
  if (!validate) validators.set(ref, (validate = ajv.compile({ $ref: ref })));
  return validate;
}

function lastSegment(ref: string): string {
  return ref.split("/").pop()!;
}

function escape(segment: string): string {
  return segment.replaceAll("~", "~0").replaceAll("/", "~1");
}

installChecker({ isDocumentedPath, recordExchange, takeViolations });
