import http2 from "node:http2";
import zlib from "node:zlib";
import { create, fromBinary, toBinary, type DescMessage } from "@bufbuild/protobuf";
import { compressedFlag, encodeEnvelope } from "@connectrpc/connect/protocol";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { StatusSchema } from "../../src/gen/google/rpc/status_pb.js";
import { DecideRequestSchema, DecideResponseSchema } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { ListSourcesRequestSchema, ListSourcesResponseSchema } from "../../src/gen/typesafe/search/v1/search_service_pb.js";
import { ErrorDetailSchema } from "../../src/gen/typesafe/error/v1/error_pb.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { balanceUnits, createTestAccount, startTestApp, type TestApp } from "../support/app.js";
import { defaultHandler, deferred, isProbe, logprobsReply, PROBE_OK, startFakeLlm, type FakeLlm } from "../support/fake-llm.js";
import { assertInvariants } from "../support/invariants.js";
import { waitFor } from "../support/wait.js";

/**
 * Unary binary gRPC over HTTP/2 is served by src/rpc/grpc-unary.ts, not by
 * Connect's streaming gRPC handler; a call whose body is gzip-compressed
 * still goes through Connect's. The same call sent both ways must get the
 * same answer: status, message, error details, the names of every header and
 * trailer, response compression, and the same charge. Connect's handler is
 * the reference here, so this file fails if the short path drifts from it.
 */

const DECIDE = "/typesafe.decision.v1.DecisionService/Decide";
const LIST_SOURCES = "/typesafe.search.v1.SearchService/ListSources";

let database: TestDatabase;
let fake: FakeLlm;
let service: TestApp;

beforeAll(async () => {
  database = await createTestDatabase();
  fake = await startFakeLlm();
  service = await startTestApp(database, {
    TYPESAFE_LLM_BASE_URL: `${fake.url}/v1`,
    TYPESAFE_LLM_MODEL: "fake-model",
    TYPESAFE_LLM_MAX_RETRIES: "0",
    // Longer than a test may take: a call still running after its caller left can only end by being cancelled.
    TYPESAFE_LLM_CALL_TIMEOUT_MS: "120000",
    TYPESAFE_LLM_REQUEST_TIMEOUT_MS: "120000",
  });
});
afterAll(async () => {
  await service?.stop();
  await fake?.close();
  await database?.close();
});

type Path = "short" | "connect";

interface RawAnswer {
  headers: http2.IncomingHttpHeaders;
  trailers: http2.IncomingHttpHeaders;
  /** The response's enveloped messages as sent: the flag byte and the bytes after the length. */
  frames: Array<{ compressed: boolean; bytes: Uint8Array }>;
}

/**
 * One gRPC call with raw bytes. "connect" gzip-compresses the request, which
 * sends it through Connect's handler; "short" sends it uncompressed and says
 * it accepts gzip, so both negotiate the same response encoding (a server
 * answers in the request's encoding when it can, else in one the caller accepts).
 */
async function call(path: string, message: Uint8Array, via: Path, headers: Record<string, string> = {}, signal?: AbortSignal): Promise<RawAnswer> {
  const framed = via === "connect" ? encodeEnvelope(compressedFlag, zlib.gzipSync(message)) : encodeEnvelope(0, message);
  const session = http2.connect(service.url);
  try {
    const stream = session.request({
      ":method": "POST",
      ":path": path,
      "content-type": "application/grpc",
      te: "trailers",
      ...(via === "connect" ? { "grpc-encoding": "gzip" } : { "grpc-accept-encoding": "gzip" }),
      ...headers,
    });
    signal?.addEventListener("abort", () => stream.close(http2.constants.NGHTTP2_CANCEL));
    const answer: RawAnswer = { headers: {}, trailers: {}, frames: [] };
    stream.once("response", (h) => (answer.headers = h));
    stream.once("trailers", (t) => (answer.trailers = t));
    const chunks: Buffer[] = [];
    stream.on("data", (chunk: Buffer) => chunks.push(chunk));
    await new Promise<void>((resolve, reject) => {
      stream.once("close", resolve);
      stream.once("error", reject);
      stream.end(framed);
    });
    const all = Buffer.concat(chunks);
    for (let at = 0; at < all.byteLength; ) {
      const length = all.readUInt32BE(at + 1);
      answer.frames.push({ compressed: all[at] === 1, bytes: all.subarray(at + 5, at + 5 + length) });
      at += 5 + length;
    }
    return answer;
  } finally {
    session.close();
  }
}

function messageOf<D extends DescMessage>(schema: D, answer: RawAnswer) {
  expect(answer.frames).toHaveLength(1);
  const frame = answer.frames[0]!;
  return fromBinary(schema, frame.compressed ? zlib.gunzipSync(frame.bytes) : frame.bytes);
}

/** A Decide answer without what differs between two calls of one account: its request id and the balance after it. */
function decisionOf(answer: RawAnswer) {
  const message = messageOf(DecideResponseSchema, answer);
  expect(message.billing?.requestId).toMatch(/^[0-9a-f-]{36}$/);
  return { ...message, billing: { ...message.billing, requestId: "", balanceCredits: 0 } };
}

/** What must agree between the two paths: header and trailer names (ids and dates differ per call) and the status. */
function shape(answer: RawAnswer) {
  const names = (h: http2.IncomingHttpHeaders) => Object.keys(h).filter((n) => n !== "date").sort();
  const details = answer.trailers["grpc-status-details-bin"];
  const status = typeof details === "string" ? fromBinary(StatusSchema, Buffer.from(details, "base64")) : undefined;
  const ours = status?.details.find((d) => d.typeUrl.endsWith(ErrorDetailSchema.typeName));
  const detail = ours ? fromBinary(ErrorDetailSchema, ours.value) : undefined;
  return {
    httpStatus: answer.headers[":status"],
    contentType: answer.headers["content-type"],
    encoding: answer.headers["grpc-encoding"],
    headerNames: names(answer.headers),
    trailerNames: names(answer.trailers),
    grpcStatus: answer.trailers["grpc-status"],
    grpcMessage: answer.trailers["grpc-message"],
    detailTypes: status?.details.map((d) => d.typeUrl),
    reason: detail?.reason,
    field: detail?.field,
    compressedFrames: answer.frames.map((f) => f.compressed),
  };
}

const decide = (questions: number) =>
  toBinary(
    DecideRequestSchema,
    create(DecideRequestSchema, {
      model: "typesafe/service-1.13",
      state: { kind: { case: "stringValue", value: "a ticket about a double charge" } },
      questions: Object.fromEntries(Array.from({ length: questions }, (_, i) => [`q${i + 1}`, { type: "noul", instructions: `Is it case ${i + 1}?` }])),
    }),
  );

describe("unary gRPC answers the same on the short path as on Connect's handler", () => {
  it("a small Decide: same answer, same charge, nothing compressed", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 1_000_000 });
    const auth = { authorization: `Bearer ${apiKey}` };
    const start = await balanceUnits(database.db, accountId);
    const short = await call(DECIDE, decide(1), "short", auth);
    const afterShort = await balanceUnits(database.db, accountId);
    const connect = await call(DECIDE, decide(1), "connect", auth);
    const afterConnect = await balanceUnits(database.db, accountId);

    expect(shape(short)).toEqual(shape(connect));
    expect(shape(short)).toMatchObject({ httpStatus: 200, contentType: "application/grpc+proto", grpcStatus: "0", compressedFrames: [false] });
    expect(decisionOf(short)).toEqual(decisionOf(connect));
    expect(start - afterShort).toBeGreaterThan(0);
    expect(start - afterShort).toBe(afterShort - afterConnect);
    await assertInvariants(database.db, accountId);
  });

  it("a large answer to a caller that accepts gzip is compressed alike (Connect compresses from 1 KiB)", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 10_000_000 });
    const short = await call(DECIDE, decide(40), "short", { authorization: `Bearer ${apiKey}` });
    const connect = await call(DECIDE, decide(40), "connect", { authorization: `Bearer ${apiKey}` });
    expect(shape(short)).toEqual(shape(connect));
    expect(shape(short)).toMatchObject({ grpcStatus: "0", encoding: "gzip", compressedFrames: [true] });
    expect(Object.keys(messageOf(DecideResponseSchema, short).answers)).toHaveLength(40);
    expect(decisionOf(short)).toEqual(decisionOf(connect));
  });

  it("a small answer to a caller that accepts gzip says gzip but is sent plain, as Connect does", async () => {
    const { apiKey } = await createTestAccount(database.db);
    const request = toBinary(ListSourcesRequestSchema, create(ListSourcesRequestSchema));
    const short = await call(LIST_SOURCES, request, "short", { authorization: `Bearer ${apiKey}` });
    const connect = await call(LIST_SOURCES, request, "connect", { authorization: `Bearer ${apiKey}` });
    expect(shape(short)).toEqual(shape(connect));
    expect(shape(short)).toMatchObject({ grpcStatus: "0", encoding: "gzip", compressedFrames: [false] });
    expect(messageOf(ListSourcesResponseSchema, short)).toEqual(messageOf(ListSourcesResponseSchema, connect));
  });

  it.each([
    ["no key", {}, () => decide(1), "16", "UNAUTHENTICATED"],
    ["a revoked-looking key", { authorization: "Bearer ts_live_notakey" }, () => decide(1), "16", "UNAUTHENTICATED"],
    ["no questions", "key", () => decide(0), "3", "INVALID_ARGUMENT"],
  ] as const)("%s: the same status, message and details", async (_name, headers, body, grpcStatus, reason) => {
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const sent = headers === "key" ? { authorization: `Bearer ${apiKey}` } : headers;
    const short = await call(DECIDE, body(), "short", sent);
    const connect = await call(DECIDE, body(), "connect", sent);
    expect(shape(short)).toEqual(shape(connect));
    expect(shape(short)).toMatchObject({ grpcStatus, reason });
    expect(short.trailers["x-request-id"]).toMatch(/^[0-9a-f-]{36}$/);
    expect(short.frames).toEqual([]);
  });

  it.each([
    ["300m", "an answer that outlives the deadline"],
    ["1n", "the smallest deadline"],
  ])("grpc-timeout %s (%s): the call ends at the deadline on both paths, the hold released, nothing charged", async (timeout) => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 1_000_000 });
    const start = await balanceUnits(database.db, accountId);
    const release = deferred();
    fake.setHandler((r) => (isProbe(r.body) ? PROBE_OK : { ...logprobsReply({ yes: 0.9, no: 0.1 }), hold: release.promise }));
    try {
      const headers = { authorization: `Bearer ${apiKey}`, "grpc-timeout": timeout };
      const [short, connect] = await Promise.all([call(DECIDE, decide(1), "short", headers), call(DECIDE, decide(1), "connect", headers)]);
      expect(shape(short)).toEqual(shape(connect));
      // The meter answers a call whose signal fired (here the deadline's) as cancelled and not charged.
      expect(shape(short)).toMatchObject({ grpcStatus: "1", reason: "CANCELLED" });
    } finally {
      release.resolve();
      fake.setHandler(defaultHandler);
    }
    await waitFor(async () => (await database.db("requests").where({ account_id: accountId, status: "active" })).length === 0, "holds released");
    expect(await balanceUnits(database.db, accountId)).toBe(start);
    await assertInvariants(database.db, accountId);
  });

  it("grpc-timeout 99999999H (the largest the format allows) is no practical deadline: the call runs to its answer on both paths, no timer overflows", async () => {
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const overflows: string[] = [];
    const onWarning = (warning: Error) => void (warning.name === "TimeoutOverflowWarning" && overflows.push(warning.message));
    process.on("warning", onWarning);
    const release = deferred();
    const reached = deferred();
    fake.setHandler((r) => (isProbe(r.body) ? PROBE_OK : (reached.resolve(), { ...logprobsReply({ yes: 0.9, no: 0.1 }), hold: release.promise })));
    try {
      const headers = { authorization: `Bearer ${apiKey}`, "grpc-timeout": "99999999H" };
      const answers = Promise.all([call(DECIDE, decide(1), "short", headers), call(DECIDE, decide(1), "connect", headers)]);
      // A deadline that fired at once would end both calls before the upstream is reached.
      await Promise.race([reached.promise, answers]);
      release.resolve();
      const [short, connect] = await answers;
      expect(shape(short)).toEqual(shape(connect));
      expect(shape(short)).toMatchObject({ grpcStatus: "0" });
      // A warning is emitted on the next tick after the timer is set; both calls set theirs long before now.
      expect(overflows).toEqual([]);
    } finally {
      process.off("warning", onWarning);
      release.resolve();
      fake.setHandler(defaultHandler);
    }
  });

  it.each(["junk", "123456789S", "1h", "-1S", "1.5S", "S", "1 S"])("grpc-timeout %j is refused on both paths as connect-es refuses it: INVALID_ARGUMENT naming the header", async (timeout) => {
    const { apiKey } = await createTestAccount(database.db, { units: 1_000_000 });
    const headers = { authorization: `Bearer ${apiKey}`, "grpc-timeout": timeout };
    const short = await call(DECIDE, decide(1), "short", headers);
    const connect = await call(DECIDE, decide(1), "connect", headers);
    expect(shape(short)).toEqual(shape(connect));
    expect(shape(short)).toMatchObject({ grpcStatus: "3", reason: "INVALID_ARGUMENT", field: "grpc-timeout" });
  });

  it("a caller that resets its stream mid-call: the upstream call is dropped, the hold released, nothing charged", async () => {
    const { apiKey, accountId } = await createTestAccount(database.db, { units: 1_000_000 });
    const start = await balanceUnits(database.db, accountId);
    const arrived = deferred();
    const dropped = deferred();
    fake.setHandler((r) => {
      if (isProbe(r.body)) return PROBE_OK;
      arrived.resolve();
      void r.cancelled.then(() => dropped.resolve());
      return { ...logprobsReply({ yes: 0.9, no: 0.1 }), hold: r.cancelled };
    });
    try {
      const abort = new AbortController();
      const answer = call(DECIDE, decide(1), "short", { authorization: `Bearer ${apiKey}` }, abort.signal);
      await arrived.promise;
      abort.abort();
      await answer.catch(() => undefined);
      await dropped.promise;
    } finally {
      fake.setHandler(defaultHandler);
    }
    await waitFor(async () => (await database.db("requests").where({ account_id: accountId, status: "active" })).length === 0, "hold released");
    expect(await balanceUnits(database.db, accountId)).toBe(start);
    const [row] = await database.db("requests").where({ account_id: accountId });
    expect(row.status).toBe("released");
    await assertInvariants(database.db, accountId);
  });
});
