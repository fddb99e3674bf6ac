import { create, createFileRegistry, setExtension, type DescService, type MessageInitShape } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, MethodOptionsSchema, file_google_protobuf_empty } from "@bufbuild/protobuf/wkt";
import { describe, expect, it } from "vitest";
import { http } from "../../src/gen/google/api/annotations_pb.js";
import { HttpRuleSchema } from "../../src/gen/google/api/http_pb.js";
import { DecisionService } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { SearchService } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { apiRoutes, served } from "../../src/gateway/routes.js";
import { httpBindingOf } from "../../src/http/http-bindings.js";

/**
 * The gateway's path table comes from the `google.api.http` annotations in
 * proto/: the contract's three paths come out of the real descriptors, and a
 * new annotated RPC gets its path without a line of gateway code.
 */
describe("routes from google.api.http", () => {
  it("the contract's paths are the annotations of the served RPCs", () => {
    const routes = apiRoutes([served(DecisionService, {} as never), served(SearchService, {} as never)].map(withEveryMethod));
    expect(routes.map((r) => [r.httpMethod, r.path, r.method.name])).toEqual([
      ["POST", "/api/v1/decisions", "Decide"],
      ["POST", "/api/v1/search", "Search"],
      ["GET", "/api/v1/sources", "ListSources"],
    ]);
    // The touches on answers stay attached to their RPC.
    expect(routes.map((r) => r.reshapeAnswerJson !== undefined)).toEqual([true, true, false]);
  });

  it("an annotated RPC added to a service gets its path; one without an annotation gets none", async () => {
    const service = probeService({ Ping: { post: "/api/v1/ping", body: "*" }, Quiet: undefined });
    const calls: string[] = [];
    const routes = apiRoutes([{ service, impl: { ping: () => (calls.push("ping"), {}), quiet: () => ({}) } } as never]);
    expect(routes.map((r) => [r.httpMethod, r.path, r.method.name])).toEqual([["POST", "/api/v1/ping", "Ping"]]);
    await routes[0]!.impl(create(routes[0]!.method.input), {} as never);
    expect(calls).toEqual(["ping"]);
  });

  it.each([
    ["put", { put: "/api/v1/ping", body: "*" }, /only get without a body and post with body "\*"/],
    ["post without body *", { post: "/api/v1/ping" }, /only get without a body and post with body "\*"/],
    ["get with a body", { get: "/api/v1/ping", body: "*" }, /only get without a body/],
    ["a path template", { get: "/api/v1/things/{name}" }, /must be a literal path/],
    ["a relative path", { get: "api/v1/ping" }, /must be a literal path/],
    ["additional bindings", { get: "/api/v1/ping", additionalBindings: [{ get: "/v1/ping" }] }, /additional_bindings/],
  ])("a binding the gateway cannot serve (%s) is refused at start, naming the RPC", (_name, rule, message) => {
    const service = probeService({ Ping: rule });
    expect(() => httpBindingOf(service.methods[0]!)).toThrow(message);
    expect(() => httpBindingOf(service.methods[0]!)).toThrow(/^test\.v1\.Probe\.Ping: /);
  });

  it("an annotated RPC without an implementation is refused", () => {
    const service = probeService({ Ping: { get: "/api/v1/ping" } });
    expect(() => apiRoutes([{ service, impl: {} } as never])).toThrow("test.v1.Probe.Ping: has an HTTP binding but no implementation");
  });
});

type Rule = { get?: string; put?: string; post?: string; body?: string; additionalBindings?: Rule[] };

/** A service descriptor `test.v1.Probe` with one Empty→Empty method per entry, annotated with its rule. */
function probeService(methods: Record<string, Rule | undefined>): DescService {
  const file = create(FileDescriptorProtoSchema, {
    name: "test/v1/probe.proto",
    package: "test.v1",
    syntax: "proto3",
    dependency: ["google/protobuf/empty.proto"],
    service: [
      {
        name: "Probe",
        method: Object.entries(methods).map(([name, rule]) => {
          const options = create(MethodOptionsSchema);
          if (rule) setExtension(options, http, create(HttpRuleSchema, httpRuleInit(rule)));
          return { name, inputType: ".google.protobuf.Empty", outputType: ".google.protobuf.Empty", options };
        }),
      },
    ],
  });
  const registry = createFileRegistry(file, (name) => (name === "google/protobuf/empty.proto" ? file_google_protobuf_empty : undefined));
  return registry.getService("test.v1.Probe")!;
}

function httpRuleInit(rule: Rule): MessageInitShape<typeof HttpRuleSchema> {
  const [verb, path] = Object.entries(rule).find(([key]) => key === "get" || key === "put" || key === "post")! as ["get" | "put" | "post", string];
  return {
    pattern: { case: verb, value: path },
    body: rule.body ?? "",
    additionalBindings: (rule.additionalBindings ?? []).map(httpRuleInit),
  };
}

/** An implementation object with a handler for every method, so only the annotations decide. */
function withEveryMethod(entry: ReturnType<typeof served>) {
  const impl = Object.fromEntries(entry.service.methods.map((m) => [m.localName, () => ({})]));
  return { service: entry.service, impl } as typeof entry;
}
