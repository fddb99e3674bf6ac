import { createContextValues, createHandlerContext } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { apiKeyFrom, generateApiKey } from "../../src/keys/api-keys.js";
import { describeError } from "../../src/errors.js";
import { DecisionService } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { kApiKey, requireApiKey } from "../../src/call/authentication.js";

/** The key's shape, checked once per call at the door and passed on. */
const contextWith = (authorization: string | undefined, values = createContextValues()) =>
  createHandlerContext({
    service: DecisionService,
    method: DecisionService.method.decide,
    protocolName: "test",
    requestMethod: "POST",
    url: "http://localhost/x",
    requestHeader: authorization === undefined ? {} : { authorization },
    contextValues: values,
  });

describe("apiKeyFrom", () => {
  const key = generateApiKey();
  it.each([
    [undefined, "missing API key: send Authorization: Bearer <key>"],
    ["Basic abc", "malformed API key: expected Authorization: Bearer ts_live_..."],
    // The last character changed (to one it is not), so the checksum no longer matches.
    [`Bearer ${key.slice(0, -1)}${key.endsWith("x") ? "y" : "x"}`, "malformed API key: expected Authorization: Bearer ts_live_..."],
  ])("%s → UNAUTHENTICATED: %s", (authorization, message) => {
    const result = apiKeyFrom(authorization);
    expect("error" in result && [describeError(result.error).reason, result.error.rawMessage]).toEqual(["UNAUTHENTICATED", message]);
  });
  it("a well-formed key is returned", () => {
    expect(apiKeyFrom(`Bearer ${key}`)).toEqual({ key });
  });
});

describe("requireApiKey", () => {
  it("takes the key the door checked, without reading the header again", () => {
    const checked = generateApiKey();
    const ctx = contextWith(undefined, createContextValues().set(kApiKey, checked));
    expect(requireApiKey(ctx)).toBe(checked);
  });
  it("checks the header when no door did, and keeps the result for the rest of the call", () => {
    const key = generateApiKey();
    const ctx = contextWith(`Bearer ${key}`);
    expect(requireApiKey(ctx)).toBe(key);
    expect(ctx.values.get(kApiKey)).toBe(key);
    expect(() => requireApiKey(contextWith(undefined))).toThrow("missing API key");
  });
});
