import { toBinary, type DescEnum, type DescExtension, type DescFile, type DescMessage } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import {
  ServerReflection as ServerReflectionV1,
  file_grpc_reflection_v1_reflection,
} from "../gen/grpc/reflection/v1/reflection_pb.js";
import {
  ServerReflection as ServerReflectionV1alpha,
  file_grpc_reflection_v1alpha_reflection,
} from "../gen/grpc/reflection/v1alpha/reflection_pb.js";

/** The request fields v1 and v1alpha share, so one function answers both versions. */
interface ReflectionRequest {
  host: string;
  messageRequest:
    | {
        case: "fileByFilename" | "fileContainingSymbol" | "allExtensionNumbersOfType" | "listServices";
        value: string;
      }
    | { case: "fileContainingExtension"; value: { containingType: string; extensionNumber: number } }
    | { case: undefined; value?: undefined };
}

/** The response oneof v1 and v1alpha share. */
type ReflectionAnswer =
  | { case: "fileDescriptorResponse"; value: { fileDescriptorProto: Uint8Array[] } }
  | { case: "allExtensionNumbersResponse"; value: { baseTypeName: string; extensionNumber: number[] } }
  | { case: "listServicesResponse"; value: { service: { name: string }[] } }
  | { case: "errorResponse"; value: { errorCode: number; errorMessage: string } };

/** Everything reflection can be asked about, by the names clients use. */
interface ReflectionIndex {
  services: string[];
  filesByName: Map<string, DescFile>;
  filesBySymbol: Map<string, DescFile>;
  filesByExtension: Map<string, DescFile>;
  extensionNumbers: Map<string, number[]>;
}

/**
 * Registers gRPC server reflection (grpc.reflection.v1 and the v1alpha that older grpcurl and
 * buf curl versions still try) so clients can call the API without a local copy of the schema.
 *
 * list_services answers with the services actually registered on `router` at the time of the
 * call, so services registered after this function, and health, are listed too. Descriptors
 * come from those services' files, from `files` (add files no service references, such as
 * error detail types) and from their transitive imports.
 */
export function registerReflection(router: ConnectRouter, files: DescFile[]): void {
  const baseFiles = [...files, file_grpc_reflection_v1_reflection, file_grpc_reflection_v1alpha_reflection];
  let cached: { handlerCount: number; index: ReflectionIndex } | undefined;
  const currentIndex = (): ReflectionIndex => {
    if (cached?.handlerCount !== router.handlers.length) {
      const serviceFiles = router.handlers.map((h) => h.service.file);
      const services = [...new Set(router.handlers.map((h) => h.service.typeName))].sort();
      const index = buildIndex(services, [...baseFiles, ...serviceFiles]);
      cached = { handlerCount: router.handlers.length, index };
    }
    return cached.index;
  };

  router.service(ServerReflectionV1, {
    async *serverReflectionInfo(requests) {
      const sent = new Set<string>();
      for await (const req of requests) {
        yield { validHost: req.host, originalRequest: req, messageResponse: answer(currentIndex(), req, sent) };
      }
    },
  });
  router.service(ServerReflectionV1alpha, {
    async *serverReflectionInfo(requests) {
      const sent = new Set<string>();
      for await (const req of requests) {
        yield { validHost: req.host, originalRequest: req, messageResponse: answer(currentIndex(), req, sent) };
      }
    },
  });
}

/** Answers one reflection request; `sent` holds the files this stream already sent. */
function answer(index: ReflectionIndex, req: ReflectionRequest, sent: Set<string>): ReflectionAnswer {
  const request = req.messageRequest;
  switch (request.case) {
    case "listServices":
      return { case: "listServicesResponse", value: { service: index.services.map((name) => ({ name })) } };
    case "fileByFilename":
      return fileResponse(index.filesByName.get(request.value), `file not found: ${request.value}`, sent);
    case "fileContainingSymbol":
      return fileResponse(index.filesBySymbol.get(request.value), `symbol not found: ${request.value}`, sent);
    case "fileContainingExtension": {
      const { containingType, extensionNumber } = request.value;
      return fileResponse(
        index.filesByExtension.get(extensionKey(containingType, extensionNumber)),
        `extension not found: ${containingType} ${extensionNumber}`,
        sent,
      );
    }
    case "allExtensionNumbersOfType": {
      const numbers = index.extensionNumbers.get(request.value);
      if (!numbers) return notFound(`type not found: ${request.value}`);
      return { case: "allExtensionNumbersResponse", value: { baseTypeName: request.value, extensionNumber: numbers } };
    }
    default:
      // Same as grpc-go: a request without a message_request is the client's bug, not a lookup miss.
      throw new ConnectError("reflection request without message_request", Code.InvalidArgument);
  }
}

function notFound(message: string): ReflectionAnswer {
  return { case: "errorResponse", value: { errorCode: Code.NotFound, errorMessage: message } };
}

/**
 * The file first, then its transitive imports not yet sent on this stream (the protocol allows
 * skipping those, and grpc-go does the same), so clients can build a complete descriptor pool.
 */
function fileResponse(file: DescFile | undefined, missing: string, sent: Set<string>): ReflectionAnswer {
  if (!file) return notFound(missing);
  const out: Uint8Array[] = [];
  const add = (f: DescFile, always: boolean) => {
    if (!always && sent.has(f.proto.name)) return;
    sent.add(f.proto.name);
    out.push(toBinary(FileDescriptorProtoSchema, f.proto));
  };
  add(file, true);
  for (const dep of transitiveDependencies(file)) add(dep, false);
  return { case: "fileDescriptorResponse", value: { fileDescriptorProto: out } };
}

function transitiveDependencies(file: DescFile): DescFile[] {
  const seen = new Set<string>([file.proto.name]);
  const out: DescFile[] = [];
  const visit = (f: DescFile) => {
    for (const dep of f.dependencies) {
      if (seen.has(dep.proto.name)) continue;
      seen.add(dep.proto.name);
      out.push(dep);
      visit(dep);
    }
  };
  visit(file);
  return out;
}

function extensionKey(containingType: string, number: number): string {
  return `${containingType}#${number}`;
}

function buildIndex(services: string[], roots: DescFile[]): ReflectionIndex {
  const index: ReflectionIndex = {
    services,
    filesByName: new Map(),
    filesBySymbol: new Map(),
    filesByExtension: new Map(),
    extensionNumbers: new Map(),
  };
  const files = new Map<string, DescFile>();
  for (const root of roots) {
    for (const f of [root, ...transitiveDependencies(root)]) files.set(f.proto.name, f);
  }
  const extensions: DescExtension[] = [];

  const addEnum = (file: DescFile, e: DescEnum) => {
    index.filesBySymbol.set(e.typeName, file);
    // Enum values are scoped as siblings of their enum, as in protoc.
    const scope = e.typeName.slice(0, e.typeName.length - e.name.length);
    for (const v of e.values) index.filesBySymbol.set(scope + v.name, file);
  };
  const addMessage = (file: DescFile, m: DescMessage) => {
    index.filesBySymbol.set(m.typeName, file);
    index.extensionNumbers.set(m.typeName, []);
    for (const f of m.fields) index.filesBySymbol.set(`${m.typeName}.${f.name}`, file);
    for (const o of m.oneofs) index.filesBySymbol.set(`${m.typeName}.${o.name}`, file);
    for (const e of m.nestedEnums) addEnum(file, e);
    for (const n of m.nestedMessages) addMessage(file, n);
    extensions.push(...m.nestedExtensions);
  };

  for (const [name, file] of files) {
    index.filesByName.set(name, file);
    for (const e of file.enums) addEnum(file, e);
    for (const m of file.messages) addMessage(file, m);
    for (const s of file.services) {
      index.filesBySymbol.set(s.typeName, file);
      for (const method of s.methods) index.filesBySymbol.set(`${s.typeName}.${method.name}`, file);
    }
    extensions.push(...file.extensions);
  }
  for (const ext of extensions) {
    index.filesBySymbol.set(ext.typeName, ext.file);
    index.filesByExtension.set(extensionKey(ext.extendee.typeName, ext.number), ext.file);
    const numbers = index.extensionNumbers.get(ext.extendee.typeName);
    if (numbers) numbers.push(ext.number);
    else index.extensionNumbers.set(ext.extendee.typeName, [ext.number]);
  }
  return index;
}
