import fs from "node:fs";
import { fileURLToPath } from "node:url";

/**
 * The committed OpenAPI document (written by `npm run generate`). src/ and
 * dist/ sit side by side, so the same relative path finds it from either.
 */
export const OPENAPI_DOCUMENT_PATH = fileURLToPath(new URL("../../src/gen/openapi.json", import.meta.url));

/** The document's text, read once at start and served as is. */
export function readOpenApiDocument(): string {
  return fs.readFileSync(OPENAPI_DOCUMENT_PATH, "utf8");
}
