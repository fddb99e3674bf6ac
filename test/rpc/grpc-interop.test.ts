import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  DecideRequestSchema,
  DecideResponseSchema,
  DecisionService,
} from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { StatusSchema } from "../../src/gen/google/rpc/status_pb.js";
import { ErrorDetailSchema, type ErrorDetail } from "../../src/gen/typesafe/error/v1/error_pb.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { createTestAccount, startTestApp, type TestApp } from "../support/app.js";

let database: TestDatabase;
let service: TestApp;
let apiKey: string;

beforeAll(async () => {
  database = await createTestDatabase();
  service = await startTestApp(database);
  ({ apiKey } = await createTestAccount(database.db, { units: 1_000_000 }));
});
afterAll(async () => {
  await service?.stop();
  await database?.close();
});

const validRequest = () =>
  create(DecideRequestSchema, {
    model: "typesafe/service-1.13",
    state: { kind: { case: "stringValue", value: "a ticket" } },
    questions: { q1: { type: "noul", instructions: "Is it urgent?" } },
  });

/** A plain @grpc/grpc-js client (no Connect code) using the generated codecs. */
function grpcJsClient(port: number) {
  const codec = <D extends DescMessage>(schema: D) => ({
    serialize: (message: MessageShape<D>) => Buffer.from(toBinary(schema, message)),
    deserialize: (bytes: Buffer) => fromBinary(schema, bytes),
  });
  const request = codec(DecideRequestSchema);
  const response = codec(DecideResponseSchema);
  const Client = grpc.makeGenericClientConstructor(
    {
      Decide: {
        path: "/typesafe.decision.v1.DecisionService/Decide",
        requestStream: false,
        responseStream: false,
        requestSerialize: request.serialize,
        requestDeserialize: request.deserialize,
        responseSerialize: response.serialize,
        responseDeserialize: response.deserialize,
      },
    },
    "DecisionService",
  );
  return new Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
}

function callGrpcJs(key: string | undefined, message = validRequest()): Promise<grpc.ServiceError> {
  const client = grpcJsClient(service.app.server.port);
  const metadata = new grpc.Metadata();
  if (key) metadata.set("authorization", `Bearer ${key}`);
  return new Promise((resolve, reject) => {
    (client as unknown as Record<string, Function>)["Decide"]!(message, metadata, (err: grpc.ServiceError | null) => {
      client.close();
      if (err) resolve(err);
      else reject(new Error("expected an error"));
    });
  });
}

/** Our ErrorDetail from grpc-status-details-bin, a google.rpc.Status read with the vendored proto. */
function detailOf(err: grpc.ServiceError): ErrorDetail {
  const status = fromBinary(StatusSchema, err.metadata.get("grpc-status-details-bin")[0] as Buffer);
  const any = status.details.find((d) => d.typeUrl.endsWith("/typesafe.error.v1.ErrorDetail"));
  if (!any) throw new Error("no ErrorDetail in grpc-status-details-bin");
  return fromBinary(ErrorDetailSchema, any.value);
}

describe("gRPC over HTTP/2 on the shared port, with an independent grpc-js client", () => {
  it("no key → UNAUTHENTICATED with the typed reason", async () => {
    const err = await callGrpcJs(undefined);
    expect(err.code).toBe(grpc.status.UNAUTHENTICATED);
    expect(detailOf(err).reason).toBe("UNAUTHENTICATED");
  });

  it("invalid request → INVALID_ARGUMENT naming the field", async () => {
    const message = validRequest();
    message.model = "other";
    const err = await callGrpcJs(apiKey, message);
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(detailOf(err)).toMatchObject({ reason: "INVALID_ARGUMENT", field: "model" });
  });

  it("valid request without an upstream → FAILED_PRECONDITION NOT_CONFIGURED, with a request id", async () => {
    const err = await callGrpcJs(apiKey);
    expect(err.code).toBe(grpc.status.FAILED_PRECONDITION);
    const detail = detailOf(err);
    expect(detail.reason).toBe("NOT_CONFIGURED");
    expect(detail.requestId).toMatch(/^[0-9a-f-]{36}$/);
  });
});

describe("Connect clients reach the same implementation", () => {
  it.each([
    ["connect over HTTP/1.1", () => createConnectTransport({ baseUrl: service.url, httpVersion: "1.1" })],
    ["connect over HTTP/2", () => createConnectTransport({ baseUrl: service.url, httpVersion: "2" })],
    ["gRPC-Web over HTTP/1.1", () => createGrpcWebTransport({ baseUrl: service.url, httpVersion: "1.1" })],
    ["gRPC via connect-node", () => createGrpcTransport({ baseUrl: service.url })],
  ])("%s: bad key → Unauthenticated, good key → NOT_CONFIGURED", async (_name, transport) => {
    const client = createClient(DecisionService, transport());
    const unauthenticated = await client.decide(validRequest()).catch((e: unknown) => ConnectError.from(e));
    expect(unauthenticated).toBeInstanceOf(ConnectError);
    expect((unauthenticated as ConnectError).code).toBe(Code.Unauthenticated);

    const notConfigured = await client
      .decide(validRequest(), { headers: { authorization: `Bearer ${apiKey}` } })
      .catch((e: unknown) => ConnectError.from(e));
    expect((notConfigured as ConnectError).code).toBe(Code.FailedPrecondition);
    expect((notConfigured as ConnectError).findDetails(ErrorDetailSchema)[0]?.reason).toBe("NOT_CONFIGURED");
  });
});

describe("the real app serves reflection and health on the shared port", () => {
  const execFileAsync = promisify(execFile);
  const bufBin = fileURLToPath(new URL("../../node_modules/.bin/buf", import.meta.url));
  const bufCurl = async (...args: string[]) =>
    (await execFileAsync(bufBin, ["curl", "--http2-prior-knowledge", "--protocol", "grpc", ...args], { timeout: 20_000 })).stdout;

  it("buf curl lists both services without a schema", async () => {
    const services = (await bufCurl("--list-services", service.url)).split("\n").filter(Boolean);
    expect(services).toEqual(expect.arrayContaining(["typesafe.decision.v1.DecisionService", "typesafe.search.v1.SearchService", "grpc.health.v1.Health"]));
  });

  it("buf curl calls Decide through reflection and gets the typed error", async () => {
    const failure = await bufCurl(
      "-H", `authorization: Bearer ${apiKey}`,
      "-d", JSON.stringify({ model: "typesafe/service-1.13", state: "x", questions: { q1: { type: "maybe", instructions: "?" } } }),
      `${service.url}/typesafe.decision.v1.DecisionService/Decide`,
    ).catch((err: { stderr: string }) => err.stderr);
    expect(failure).toContain("invalid_argument");
    expect(failure).toContain("questions.q1.type");
  });

  it("grpc.health.v1 reports SERVING for the whole server", async () => {
    const out = await bufCurl("-d", "{}", `${service.url}/grpc.health.v1.Health/Check`);
    expect(JSON.parse(out)).toEqual({ status: "SERVING" });
  });
});

describe("the Connect JSON surface applies the contract like the gateway", () => {
  it("an unknown field is INVALID_ARGUMENT, not ignored", async () => {
    const response = await fetch(`${service.url}/typesafe.search.v1.SearchService/Search`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` },
      body: JSON.stringify({ q: "x", bogus: 1 }),
    });
    expect(response.status).toBe(400);
    expect(await response.json()).toMatchObject({ code: "invalid_argument" });
  });
});
