import fs from "node:fs";
import { Ajv2020, type ValidateFunction } from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { OPENAPI_DOCUMENT_PATH } from "../../src/openapi/served.js";

/**
 * Every gateway answer the test suite receives is checked against the
 * committed OpenAPI document (src/gen/openapi.json): its status must be a
 * documented response of the operation, its body must validate against that
 * response's schema, and its required headers must be there. The vitest
 * setup file openapi-conformance.setup.ts passes every answer here and fails a
 * test that received an undocumented one; this module has no vitest hooks, so
 * scripts (npm run fuzz) can use the test helpers that register origins. Only
 * answers of registered service origins are checked (the fakes of the
 * providers have paths of their own).
 */
type OpenApiDocument = {
  paths: Record<string, Record<string, { responses: Record<string, DocumentedResponse | { $ref: string }> }>>;
  components: { responses: Record<string, DocumentedResponse> };
};
type DocumentedResponse = { headers?: Record<string, { required?: boolean; schema: object }>; content?: Record<string, { schema: object }> };

const document = JSON.parse(fs.readFileSync(OPENAPI_DOCUMENT_PATH, "utf8")) as OpenApiDocument;
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats.default(ajv);
ajv.addSchema(document, "openapi.json");
const validators = new Map<string, ValidateFunction>();

const serviceOrigins = new Set<string>();
const violations: string[] = [];
let checked = 0;

/** Answers from this origin (a test's service) are checked from now on. */
export function checkAnswersOf(url: string): void {
  serviceOrigins.add(new URL(url).origin);
}

/** How many answers have been checked in this test file. */
export function checkedAnswerCount(): number {
  return checked;
}

/** What is wrong with one answer, by the document; empty when it conforms or the path is not documented. */
export function violationsOf(method: string, path: string, status: number, headers: Headers, body: string): string[] {
  const operation = document.paths[path]?.[method.toLowerCase()];
  if (!operation) return []; // 404 and 405 answers are to paths and methods the document does not have
  const where = `${method} ${path} → ${status}`;
  const declared = operation.responses[String(status)];
  if (!declared) return [`${where}: status not documented`];
  const response = "$ref" in declared ? document.components.responses[declared.$ref.split("/").pop()!]! : declared;
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
  const pointer = "$ref" in declared ? `#/components/responses/${declared.$ref.split("/").pop()}` : `#/paths/${escape(path)}/${method.toLowerCase()}/responses/${status}`;
  const schemaRef = `openapi.json${pointer}/content/application~1json/schema`;
  let validate = validators.get(schemaRef);
  if (!validate) validators.set(schemaRef, (validate = ajv.compile({ $ref: schemaRef })));
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch {
    return [...problems, `${where}: body is not JSON`];
  }
  if (!validate(json)) problems.push(`${where}: ${ajv.errorsText(validate.errors)} in ${body.slice(0, 300)}`);
  return problems;
}

function escape(path: string): string {
  return path.replaceAll("~", "~0").replaceAll("/", "~1");
}

/** Checks one answer that fetch received, if it came from a registered service origin. */
export async function recordAnswer(input: string | URL | Request, init: RequestInit | undefined, response: Response): Promise<void> {
  const url = new URL(response.url || (input instanceof Request ? input.url : String(input)));
  if (!serviceOrigins.has(url.origin)) return;
  const method = init?.method ?? (input instanceof Request ? input.method : "GET");
  const body = await response.clone().text();
  checked++;
  violations.push(...violationsOf(method, url.pathname, response.status, response.headers, body));
}

/** The violations found since the last call, and forgets them. */
export function takeViolations(): string[] {
  return violations.splice(0);
}
