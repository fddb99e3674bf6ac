import zlib from "node:zlib";
import { create, toBinary } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ErrorDetailSchema } from "../../src/gen/typesafe/error/v1/error_pb.js";
import { SearchRequestSchema } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { takeDeadlineProblem } from "../../src/rpc/grpc-timeout.js";
import { createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { callConnect, callGrpc, callGrpcWeb, envelope, type WireAnswer } from "../support/wire.js";

/**
 * Every body passes the same gate, compressed or not, on gRPC, gRPC-Web,
 * Connect and the JSON gateway: decompressed first (gzip and br, bounded by
 * the body limit), then checked as an uncompressed body is. No input is
 * answered INTERNAL or 500.
 */
let database: TestDatabase;
let service: TestApp;
let apiKey: string;

const SEARCH = "/typesafe.search.v1.SearchService/Search";
/** gRPC status codes (grpc/doc/statuscodes.md). */
const GRPC = { invalidArgument: 3, resourceExhausted: 8, failedPrecondition: 9, unimplemented: 12 };

beforeAll(async () => {
  database = await createTestDatabase(4);
  service = await startTestApp(database);
  ({ apiKey } = await createTestAccount(database.db, { units: 1_000_000 }));
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

const COMPRESS = { gzip: (b: Uint8Array) => zlib.gzipSync(b), br: (b: Uint8Array) => zlib.brotliCompressSync(b) } as const;
type Encoding = keyof typeof COMPRESS;
/** A valid search: it passes the gate, and the service answers NOT_CONFIGURED (no source is enabled in tests). */
const validSearch = toBinary(SearchRequestSchema, create(SearchRequestSchema, { q: "x" }));
/** Inflates to well past the 96 KB limit from a body of a few KB. */
const bombOf = (encoding: Encoding) => COMPRESS[encoding](new Uint8Array(4 * 1024 * 1024));

/** One compressed message on each binary RPC surface: its bytes compressed as the protocol carries them. */
async function sendCompressed(surface: "grpc" | "grpc-web" | "connect", encoding: Encoding | "zstd", message: Uint8Array, compressed: Uint8Array = COMPRESS[encoding as Encoding]?.(message) ?? message): Promise<WireAnswer> {
  if (surface === "connect") return callConnect(service.url, SEARCH, compressed, { apiKey, binary: true, headers: { "content-encoding": encoding } });
  const frame = Uint8Array.from([1, ...envelope(compressed).subarray(1)]);
  const init = { apiKey, raw: true, headers: { "grpc-encoding": encoding } };
  return surface === "grpc" ? callGrpc(service.url, SEARCH, frame, init) : callGrpcWeb(service.url, SEARCH, frame, init);
}

/** What a surface said: HTTP status on Connect, grpc-status on gRPC and gRPC-Web, with the typed reason and field. */
const verdict = (a: WireAnswer) => ({ status: a.status, reason: a.reason, field: a.field });

describe.each(["grpc", "grpc-web", "connect"] as const)("compressed bodies on %s", (surface) => {
  const grpcFamily = surface !== "connect";
  it.each(["gzip", "br"] as const)("a valid %s body passes the gate like the same body uncompressed", async (encoding) => {
    const answer = await sendCompressed(surface, encoding, validSearch);
    expect(verdict(answer)).toEqual({ status: grpcFamily ? GRPC.failedPrecondition : 400, reason: "NOT_CONFIGURED", field: undefined });
  });

  it.each(["gzip", "br"] as const)("a %s body that decompresses to malformed protobuf is MALFORMED_MESSAGE, not INTERNAL", async (encoding) => {
    const answer = await sendCompressed(surface, encoding, Uint8Array.of(0x0a, 0xff));
    expect(verdict(answer)).toEqual({ status: grpcFamily ? GRPC.invalidArgument : 400, reason: "MALFORMED_MESSAGE", field: "body" });
  });

  it.each(["gzip", "br"] as const)("a small %s body that inflates past 96 KB is PAYLOAD_TOO_LARGE with the limit", async (encoding) => {
    const answer = await sendCompressed(surface, encoding, new Uint8Array(0), bombOf(encoding));
    expect(verdict(answer)).toEqual({ status: grpcFamily ? GRPC.resourceExhausted : 413, reason: "PAYLOAD_TOO_LARGE", field: "body" });
    expect(answer.metadata?.["max_bytes"]).toBe(String(96 * 1024));
  });

  it.each(["gzip", "br"] as const)("a body that is not %s data is INVALID_ARGUMENT naming the body and the rule", async (encoding) => {
    const answer = await sendCompressed(surface, encoding, new Uint8Array(0), Uint8Array.of(1, 2, 3, 4, 5, 6));
    expect(verdict(answer)).toEqual({ status: grpcFamily ? GRPC.invalidArgument : 400, reason: "INVALID_ARGUMENT", field: "body" });
    expect(answer.metadata?.["encoding"]).toBe(encoding);
  });

  it("an encoding the server does not accept is UNIMPLEMENTED, listing the accepted ones as the protocol says", async () => {
    const answer = await sendCompressed(surface, "zstd", validSearch);
    const acceptHeader = grpcFamily ? "grpc-accept-encoding" : "accept-encoding";
    expect(verdict(answer)).toEqual({ status: grpcFamily ? GRPC.unimplemented : 501, reason: "UNSUPPORTED_ENCODING", field: grpcFamily ? "grpc-encoding" : "content-encoding" });
    expect(answer.headers?.[acceptHeader]).toBe("gzip,br");
    if (!grpcFamily) expect(answer.connectCode).toBe("unimplemented");
  });
});

describe("the compressed flag", () => {
  it.each([
    ["no grpc-encoding", {}],
    ["grpc-encoding identity", { "grpc-encoding": "identity" }],
  ])("set with %s is refused (INVALID_ARGUMENT, grpc-go's rule), never decoded as if plain", async (_name, headers) => {
    const frame = Uint8Array.from([1, ...envelope(validSearch).subarray(1)]);
    for (const answer of [
      await callGrpc(service.url, SEARCH, frame, { apiKey, raw: true, headers }),
      await callGrpcWeb(service.url, SEARCH, frame, { apiKey, raw: true, headers }),
    ]) {
      expect(verdict(answer)).toEqual({ status: GRPC.invalidArgument, reason: "INVALID_ARGUMENT", field: "body" });
    }
  });
});

describe("Connect errors are Connect's error JSON whatever the content type", () => {
  it.each([
    ["application/proto; charset=utf-8 (no Connect content type) with an oversized body", "application/proto; charset=utf-8", new Uint8Array(200 * 1024), 415, "UNSUPPORTED_MEDIA_TYPE", "invalid_argument"],
    ["text/plain", "text/plain", new TextEncoder().encode("q=x"), 415, "UNSUPPORTED_MEDIA_TYPE", "invalid_argument"],
    ["gRPC-Web's text form (Connect serves none)", "application/grpc-web-text", new TextEncoder().encode("AAAAAAA="), 415, "UNSUPPORTED_MEDIA_TYPE", "invalid_argument"],
    ["a Connect streaming content type on a unary method", "application/connect+json", new TextEncoder().encode("{}"), 415, "UNSUPPORTED_MEDIA_TYPE", "invalid_argument"],
    ["APPLICATION/JSON in capitals (served, as Connect matches it)", "APPLICATION/JSON", new TextEncoder().encode('{"q":"x","s":[]}'), 400, "INVALID_ARGUMENT", "invalid_argument"],
    ["application/json; charset=utf-8 with an oversized body", "application/json; charset=utf-8", new TextEncoder().encode(`{"q":"${"x".repeat(200 * 1024)}"}`), 413, "PAYLOAD_TOO_LARGE", "resource_exhausted"],
    ["application/json;charset=UTF-8 nested past the depth rule", "application/json;charset=UTF-8", new TextEncoder().encode(`{"model":"typesafe/service-1.13","state":${'{"a":'.repeat(60)}1${"}".repeat(60)},"questions":{"q":{"type":"noul","instructions":"ok?"}}}`), 400, "INVALID_ARGUMENT", "invalid_argument"],
    ["application/json; charset=utf-8 without a key", "application/json; charset=utf-8", new TextEncoder().encode('{"q":"x"}'), 401, "UNAUTHENTICATED", "unauthenticated"],
    ["application/proto without a key", "application/proto", validSearch, 401, "UNAUTHENTICATED", "unauthenticated"],
    ["application/json; charset=utf-8 for a service that is not configured", "application/json; charset=utf-8", new TextEncoder().encode('{"q":"x"}'), 400, "NOT_CONFIGURED", "failed_precondition"],
  ] as const)("%s → %i with code, message and the typed detail", async (_name, contentType, body, status, reason, code) => {
    const path = reason === "INVALID_ARGUMENT" && !contentType.startsWith("APPLICATION") ? "/typesafe.decision.v1.DecisionService/Decide" : SEARCH;
    const answer = await callConnect(service.url, path, body, { apiKey: reason === "UNAUTHENTICATED" ? undefined : apiKey, contentType });
    expect({ status: answer.status, reason: answer.reason, code: answer.connectCode }).toEqual({ status, reason, code });
    expect(answer.headers?.["content-type"]).toBe("application/json");
    expect(answer.requestId).toMatch(/^[0-9a-f-]{36}$/);
  });
});

describe("the gateway takes the same encodings", () => {
  const post = (body: Uint8Array | string, encoding: string) =>
    fetch(`${service.url}/api/v1/search`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}`, "content-encoding": encoding },
      body: typeof body === "string" ? body : Buffer.from(body),
    });

  it.each(["gzip", "br"] as const)("a %s JSON body is checked as the same body plain (the search rule names s)", async (encoding) => {
    const answer = await post(COMPRESS[encoding](new TextEncoder().encode('{"q":"x","s":[]}')), encoding);
    expect(answer.status).toBe(400);
    expect((await answer.json()).data).toMatchObject({ reason: "INVALID_ARGUMENT", field: "s" });
  });

  it("a gzip bomb is 413 PAYLOAD_TOO_LARGE", async () => {
    const answer = await post(bombOf("gzip"), "gzip");
    expect([answer.status, (await answer.json()).data.reason]).toEqual([413, "PAYLOAD_TOO_LARGE"]);
  });

  it("an encoding it does not accept is 415 UNSUPPORTED_ENCODING with Accept-Encoding", async () => {
    const answer = await post("{}", "zstd");
    expect([answer.status, answer.headers.get("accept-encoding"), (await answer.json()).data]).toEqual([
      415,
      "gzip,br",
      expect.objectContaining({ reason: "UNSUPPORTED_ENCODING", field: "content-encoding" }),
    ]);
  });
});

describe("deadline headers as the protocols define them", () => {
  const take = (name: string, value: string, grpcFamily: boolean) => {
    const header = new Headers({ [name]: value });
    const problem = takeDeadlineProblem(header, grpcFamily);
    return { kept: header.get(name), field: problem?.findDetails(ErrorDetailSchema)[0]?.field };
  };
  it.each([
    ["1n", "1n", undefined],
    ["99999999H (too long for a timer: no deadline)", null, undefined],
    ["2147483S (fits a timer)", "2147483S", undefined],
    ["2147484S (does not fit a timer: no deadline)", null, undefined],
    ["12345678m", "12345678m", undefined],
    ["junk", null, "grpc-timeout"],
    ["123456789S (nine digits)", null, "grpc-timeout"],
    ["1h (no such unit)", null, "grpc-timeout"],
  ])("grpc-timeout %s", (value, kept, field) => {
    expect(take("grpc-timeout", value.split(" ")[0]!, true)).toEqual({ kept, field });
  });
  it.each([
    ["2147483647", "2147483647", undefined],
    ["9999999999 (ten digits, too long for a timer)", null, undefined],
    ["-5", null, "connect-timeout-ms"],
  ])("connect-timeout-ms %s", (value, kept, field) => {
    expect(take("connect-timeout-ms", value.split(" ")[0]!, false)).toEqual({ kept, field });
  });
});
