import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createFileRegistry, fromBinary } from "@bufbuild/protobuf";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import { getComments } from "@bufbuild/protoplugin";
import { DecisionService } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { SearchService } from "../gen/typesafe/search/v1/search_service_pb.js";
import { AccountService } from "../gen/typesafe/account/v1/account_service_pb.js";
import { buildOpenApiDocument, type DocumentedService } from "./document.js";
import { OPENAPI_DOCUMENT_PATH } from "./served.js";
import { OPENAPI_TYPES_PATH, renderOpenApiTypes } from "./typescript-types.js";

/**
 * The services whose `google.api.http` bindings the document describes, one
 * section (tag) each, with the door their callers pass (as the app wires
 * them). A new service with bindings is one more entry here.
 */
const DOCUMENTED_SERVICES: DocumentedService[] = [
  { typeName: DecisionService.typeName, door: "apiKey" },
  { typeName: SearchService.typeName, door: "apiKey" },
  { typeName: AccountService.typeName, door: "session" },
];

/**
 * `npm run generate` (after `buf generate`): writes src/gen/openapi.json from
 * proto/, and src/gen/openapi-types.ts from the document. `buf build` gives
 * the descriptors with their comments, which become the document's
 * descriptions. CI regenerates both and fails when they differ.
 */
const scratch = fs.mkdtempSync(path.join(os.tmpdir(), "typesafe-openapi-"));
try {
  const image = path.join(scratch, "image.binpb");
  execFileSync("buf", ["build", "-o", image], { stdio: "inherit" });
  const registry = createFileRegistry(fromBinary(FileDescriptorSetSchema, fs.readFileSync(image)));
  const { version } = JSON.parse(fs.readFileSync("package.json", "utf8")) as { version: string };
  const document = buildOpenApiDocument(registry, DOCUMENTED_SERVICES, version, (desc) => {
    const text = getComments(desc).leading?.trim();
    return text ? text.replace(/\s*\n\s*/g, " ") : undefined;
  });
  const text = `${JSON.stringify(document, null, 2)}\n`;
  fs.writeFileSync(OPENAPI_DOCUMENT_PATH, text);
  fs.writeFileSync(OPENAPI_TYPES_PATH, await renderOpenApiTypes(text));
} finally {
  fs.rmSync(scratch, { recursive: true, force: true });
}
