/**
 * A TypeScript service calling typesafe over gRPC with the generated Connect
 * client. The code in src/gen comes from proto/ by `npm run generate`.
 *
 * Usage: TYPESAFE_URL=http://127.0.0.1:8080 TYPESAFE_KEY=ts_live_… npx tsx examples/typescript/client.ts
 * It prints one JSON object: a decision, a search, and an error read from its typed detail.
 * When the service refuses a call (decisions not configured, a wrong key), it
 * prints the service's reason and message on stderr and exits 1.
 */
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { DecisionService } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";
import { ErrorDetailSchema } from "../../src/gen/typesafe/error/v1/error_pb.js";
import { SearchService } from "../../src/gen/typesafe/search/v1/search_service_pb.js";

const baseUrl = process.env.TYPESAFE_URL ?? "http://127.0.0.1:8080";
const key = process.env.TYPESAFE_KEY ?? "";

// gRPC over HTTP/2 without TLS (prior knowledge), as the service listens.
const transport = createGrpcTransport({ baseUrl });
const decisions = createClient(DecisionService, transport);
const search = createClient(SearchService, transport);
const headers = { authorization: `Bearer ${key}` };

/** The service's verdict on a refused call, from its typed detail. */
function refusal(err: unknown): { code: string; reason: string; field: string; message: string } {
  const error = ConnectError.from(err);
  const detail = error.findDetails(ErrorDetailSchema)[0];
  return { code: Code[error.code], reason: detail?.reason ?? "", field: detail?.field ?? "", message: error.rawMessage };
}

// Any refusal below ends the run with the service's own words, not a stack trace.
process.on("uncaughtException", (err) => {
  const { code, reason, message } = refusal(err);
  console.error(`typesafe refused the call: ${reason || code}: ${message}`);
  process.exit(1);
});

const decided = await decisions.decide(
  {
    model: "typesafe/service-1.13",
    // `state` is a google.protobuf.Value: a text or a JSON object.
    state: { kind: { case: "stringValue", value: "I was charged twice for my March invoice" } },
    questions: { refund: { type: "noul", instructions: "Is the customer asking for a refund?" } },
  },
  { headers, timeoutMs: 20_000 },
);
const refund = decided.answers["refund"];

// Only `q` is required: `s` falls back to the default sources and `w` to "any".
const found = await search.search({ q: "rust async runtime" }, { headers, timeoutMs: 20_000 });

// Read an error from its typed detail, never from the message text.
let refused: { code: string; reason: string; field: string } | undefined;
try {
  await decisions.decide({ model: "another-model", questions: {} }, { headers });
} catch (err) {
  const { code, reason, field } = refusal(err);
  refused = { code, reason, field };
}

console.log(
  JSON.stringify({
    decision: { refund: refund?.noul, method: refund?.xMethod, charged_credits: decided.billing?.chargedCredits },
    search: { sources: found.s, results: found.results.length, first_url: found.results[0]?.url ?? "" },
    refused,
  }),
);
