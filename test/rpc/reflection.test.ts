import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { create, createFileRegistry, fromBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, FileDescriptorSetSchema, type FileDescriptorProto } from "@bufbuild/protobuf/wkt";
import { Code, createClient, type Client } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  ServerReflection,
  type ServerReflectionRequestSchema,
  type ServerReflectionResponse,
} from "../../src/gen/grpc/reflection/v1/reflection_pb.js";
import { ServerReflection as ServerReflectionV1alpha } from "../../src/gen/grpc/reflection/v1alpha/reflection_pb.js";
import { DecisionService } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { file_typesafe_error_v1_error } from "../../src/gen/typesafe/error/v1/error_pb.js";
import { SearchService } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { registerHealth } from "../../src/rpc/health.js";
import { registerReflection } from "../../src/rpc/reflection.js";
import { startH2cServer, type H2cServer } from "../support/h2c-server.js";

const execFileAsync = promisify(execFile);
const bufBin = fileURLToPath(new URL("../../node_modules/.bin/buf", import.meta.url));

const DECISION_FILE = "typesafe/decision/v1/decision_service.proto";
const SEARCH_FILE = "typesafe/search/v1/search_service.proto";
const HEALTH_FILE = "grpc/health/v1/health.proto";
const STRUCT_FILE = "google/protobuf/struct.proto";
/** google.api.http on the RPCs brings its annotation files and their import. */
const HTTP_ANNOTATION_FILES = ["google/api/annotations.proto", "google/api/http.proto", "google/protobuf/descriptor.proto"];

let server: H2cServer;
let client: Client<typeof ServerReflection>;

beforeAll(async () => {
  server = await startH2cServer((router) => {
    // Reflection first: services registered after it must still be listed.
    registerReflection(router, [file_typesafe_error_v1_error]);
    router.service(DecisionService, {});
    router.service(SearchService, { listSources: () => ({ sources: [{ id: "web", kind: "web", isDefault: true }] }) });
    registerHealth(router, async () => true);
  });
  client = createClient(ServerReflection, createGrpcTransport({ baseUrl: server.baseUrl }));
});

afterAll(async () => {
  await server?.close();
});

/** Sends all requests on one reflection stream, as grpcurl and buf curl do, and collects the answers. */
async function reflect(
  ...requests: MessageInitShape<typeof ServerReflectionRequestSchema>[]
): Promise<ServerReflectionResponse[]> {
  async function* send() {
    yield* requests;
  }
  const responses: ServerReflectionResponse[] = [];
  for await (const res of client.serverReflectionInfo(send())) responses.push(res);
  return responses;
}

async function reflectOne(request: MessageInitShape<typeof ServerReflectionRequestSchema>) {
  const [res, ...rest] = await reflect(request);
  expect(rest).toEqual([]);
  if (!res) throw new Error("no reflection response");
  return res;
}

function decodedFiles(res: ServerReflectionResponse): FileDescriptorProto[] {
  if (res.messageResponse.case !== "fileDescriptorResponse") {
    throw new Error(`expected a file descriptor response, got ${String(res.messageResponse.case)}`);
  }
  return res.messageResponse.value.fileDescriptorProto.map((b) => fromBinary(FileDescriptorProtoSchema, b));
}

describe("grpc.reflection.v1 over the gRPC protocol", () => {
  it("lists every registered service, including health and reflection", async () => {
    const res = await reflectOne({ host: "localhost", messageRequest: { case: "listServices", value: "" } });
    expect(res.validHost).toBe("localhost");
    expect(res.originalRequest?.messageRequest.case).toBe("listServices");
    expect(res.messageResponse.case).toBe("listServicesResponse");
    const names =
      res.messageResponse.case === "listServicesResponse"
        ? res.messageResponse.value.service.map((s) => s.name)
        : [];
    expect(names).toEqual([
      "grpc.health.v1.Health",
      "grpc.reflection.v1.ServerReflection",
      "grpc.reflection.v1alpha.ServerReflection",
      "typesafe.decision.v1.DecisionService",
      "typesafe.search.v1.SearchService",
    ]);
  });

  it.each([
    ["typesafe.decision.v1.DecisionService", DECISION_FILE],
    ["typesafe.search.v1.SearchService", SEARCH_FILE],
    ["typesafe.search.v1.SearchService.ListSources", SEARCH_FILE],
    ["typesafe.search.v1.SearchRequest", SEARCH_FILE],
    ["typesafe.search.v1.SearchRequest.q", SEARCH_FILE],
    ["grpc.health.v1.HealthCheckResponse.ServingStatus", HEALTH_FILE],
    ["grpc.health.v1.HealthCheckResponse.SERVING", HEALTH_FILE],
    ["typesafe.error.v1.ErrorDetail", "typesafe/error/v1/error.proto"],
    ["google.protobuf.Value", STRUCT_FILE],
  ])("file_containing_symbol %s names %s first", async (symbol, fileName) => {
    const res = await reflectOne({ messageRequest: { case: "fileContainingSymbol", value: symbol } });
    expect(decodedFiles(res)[0]?.name).toBe(fileName);
  });

  it("file_containing_symbol returns a descriptor that describes the service", async () => {
    const res = await reflectOne({
      messageRequest: { case: "fileContainingSymbol", value: "typesafe.decision.v1.DecisionService" },
    });
    const [file, ...deps] = decodedFiles(res);
    expect(file?.package).toBe("typesafe.decision.v1");
    expect(file?.service.map((s) => s.name)).toEqual(["DecisionService"]);
    expect(file?.service[0]?.method.map((m) => m.name)).toEqual(["Decide"]);
    expect(deps.map((d) => d.name)).toEqual([...HTTP_ANNOTATION_FILES, STRUCT_FILE]);
  });

  it("file_by_filename includes transitive dependencies, enough to rebuild the schema", async () => {
    const res = await reflectOne({ messageRequest: { case: "fileByFilename", value: DECISION_FILE } });
    const files = decodedFiles(res);
    expect(files.map((f) => f.name)).toEqual([DECISION_FILE, ...HTTP_ANNOTATION_FILES, STRUCT_FILE]);
    // A FileDescriptorSet lists imports before their importers.
    const registry = createFileRegistry(create(FileDescriptorSetSchema, { file: [...files].reverse() }));
    expect(registry.getService("typesafe.decision.v1.DecisionService")?.methods.map((m) => m.name)).toEqual([
      "Decide",
    ]);
  });

  it("does not resend dependencies already sent on the same stream, but always sends the requested file", async () => {
    const [first, second] = await reflect(
      { messageRequest: { case: "fileByFilename", value: DECISION_FILE } },
      { messageRequest: { case: "fileByFilename", value: DECISION_FILE } },
    );
    if (!first || !second) throw new Error("expected two responses");
    expect(decodedFiles(first).map((f) => f.name)).toEqual([DECISION_FILE, ...HTTP_ANNOTATION_FILES, STRUCT_FILE]);
    expect(decodedFiles(second).map((f) => f.name)).toEqual([DECISION_FILE]);
  });

  it.each([
    ["fileContainingSymbol", "typesafe.nope.v1.Nope"],
    ["fileByFilename", "typesafe/nope/v1/nope.proto"],
    ["allExtensionNumbersOfType", "typesafe.nope.v1.Nope"],
  ] as const)("%s %s yields error_response NOT_FOUND", async (kind, value) => {
    const res = await reflectOne({ messageRequest: { case: kind, value } });
    expect(res.messageResponse.case).toBe("errorResponse");
    expect(res.messageResponse.value).toMatchObject({ errorCode: Code.NotFound });
    expect(res.originalRequest?.messageRequest).toEqual({ case: kind, value });
  });

  it("file_containing_extension for an unknown extension yields NOT_FOUND", async () => {
    const res = await reflectOne({
      messageRequest: {
        case: "fileContainingExtension",
        value: { containingType: "typesafe.search.v1.SearchRequest", extensionNumber: 100 },
      },
    });
    expect(res.messageResponse.case).toBe("errorResponse");
    expect(res.messageResponse.value).toMatchObject({ errorCode: Code.NotFound });
  });

  it("all_extension_numbers_of_type for a known message is an empty list", async () => {
    const res = await reflectOne({
      messageRequest: { case: "allExtensionNumbersOfType", value: "typesafe.search.v1.SearchRequest" },
    });
    expect(res.messageResponse.case).toBe("allExtensionNumbersResponse");
    expect(res.messageResponse.value).toMatchObject({
      baseTypeName: "typesafe.search.v1.SearchRequest",
      extensionNumber: [],
    });
  });

  it("keeps the stream usable after a miss", async () => {
    const responses = await reflect(
      { messageRequest: { case: "fileContainingSymbol", value: "typesafe.nope.v1.Nope" } },
      { messageRequest: { case: "fileContainingSymbol", value: "typesafe.search.v1.SearchService" } },
    );
    expect(responses.map((r) => r.messageResponse.case)).toEqual(["errorResponse", "fileDescriptorResponse"]);
  });
});

describe("grpc.reflection.v1alpha", () => {
  it("answers the same as v1", async () => {
    const alpha = createClient(
      ServerReflectionV1alpha,
      createGrpcTransport({ baseUrl: server.baseUrl }),
    );
    async function* send() {
      yield { messageRequest: { case: "fileContainingSymbol" as const, value: "typesafe.search.v1.SearchService" } };
      yield { messageRequest: { case: "fileContainingSymbol" as const, value: "typesafe.nope.v1.Nope" } };
    }
    const cases: (string | undefined)[] = [];
    const names: string[] = [];
    for await (const res of alpha.serverReflectionInfo(send())) {
      cases.push(res.messageResponse.case);
      if (res.messageResponse.case === "fileDescriptorResponse") {
        const files = res.messageResponse.value.fileDescriptorProto;
        names.push(...files.map((b) => fromBinary(FileDescriptorProtoSchema, b).name));
      }
    }
    expect(cases).toEqual(["fileDescriptorResponse", "errorResponse"]);
    expect(names).toEqual([SEARCH_FILE, ...HTTP_ANNOTATION_FILES]);
  });
});

describe("buf curl, with no local schema", () => {
  /** Runs the real buf CLI (async: this process also serves the requests). */
  async function bufCurl(...args: string[]): Promise<string> {
    const { stdout } = await execFileAsync(bufBin, ["curl", "--http2-prior-knowledge", ...args], {
      timeout: 20_000,
    });
    return stdout;
  }

  it.each([
    ["the Connect protocol (buf curl's default)", []],
    ["gRPC, reflection v1", ["--protocol", "grpc", "--reflect-protocol", "grpc-v1"]],
    ["gRPC, reflection v1alpha", ["--protocol", "grpc", "--reflect-protocol", "grpc-v1alpha"]],
  ])("--list-methods over %s", async (_name, flags) => {
    const methods = (await bufCurl(...flags, "--list-methods", server.baseUrl)).trim().split("\n");
    expect(methods).toEqual(
      expect.arrayContaining([
        "typesafe.decision.v1.DecisionService/Decide",
        "typesafe.search.v1.SearchService/Search",
        "typesafe.search.v1.SearchService/ListSources",
        "grpc.health.v1.Health/Check",
        "grpc.health.v1.Health/Watch",
      ]),
    );
  });

  it("calls a method using the schema it learned by reflection", async () => {
    const url = `${server.baseUrl}/typesafe.search.v1.SearchService/ListSources`;
    const out = await bufCurl("--protocol", "grpc", "-d", "{}", url);
    expect(JSON.parse(out)).toEqual({ sources: [{ id: "web", kind: "web", isDefault: true }] });
  });
});
