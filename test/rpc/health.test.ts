import { EventEmitter, once } from "node:events";
import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../../src/gen/grpc/health/v1/health_pb.js";
import { registerHealth } from "../../src/rpc/health.js";
import { startH2cServer, type H2cServer } from "../support/h2c-server.js";

/** What the injected check reports next: a verdict, or an error to reject with. */
let verdict: boolean | Error = true;
let checkCalls = 0;
const checkEvents = new EventEmitter();

async function check(): Promise<boolean> {
  checkCalls += 1;
  checkEvents.emit("call", checkCalls);
  if (verdict instanceof Error) throw verdict;
  return verdict;
}

/** Resolves once check() has run `n` more times: proof that Watch polled without waiting on a clock. */
function checkRunsMore(n: number): Promise<void> {
  const target = checkCalls + n;
  return new Promise((resolve) => {
    const onCall = (count: number) => {
      if (count < target) return;
      checkEvents.off("call", onCall);
      resolve();
    };
    checkEvents.on("call", onCall);
  });
}

/** Emits "ended" when a server-streaming response finishes on the server, however it finished. */
const serverStreams = new EventEmitter();
const observeStreamEnd: Interceptor = (next) => async (req) => {
  const res = await next(req);
  if (!res.stream) return res;
  const source = res.message;
  async function* observed() {
    try {
      yield* source;
    } finally {
      serverStreams.emit("ended", req.method.name);
    }
  }
  return { ...res, message: observed() };
};

let server: H2cServer;
let client: Client<typeof Health>;

beforeAll(async () => {
  server = await startH2cServer((router) => registerHealth(router, check, { watchIntervalMs: 5 }), [observeStreamEnd]);
  client = createClient(Health, createGrpcTransport({ baseUrl: server.baseUrl }));
});

afterAll(async () => {
  await server?.close();
});

beforeEach(() => {
  verdict = true;
});

const SERVICES = ["", "typesafe.decision.v1.DecisionService", "typesafe.search.v1.SearchService"];

describe("Health.Check", () => {
  it.each(SERVICES)("service %j is SERVING when the check passes", async (service) => {
    expect((await client.check({ service })).status).toBe(ServingStatus.SERVING);
  });

  it.each(SERVICES)("service %j is NOT_SERVING when the check fails", async (service) => {
    verdict = false;
    expect((await client.check({ service })).status).toBe(ServingStatus.NOT_SERVING);
  });

  it("reports NOT_SERVING, not an error, when the check rejects", async () => {
    verdict = new Error("database unreachable");
    expect((await client.check({ service: "" })).status).toBe(ServingStatus.NOT_SERVING);
  });

  it.each(["typesafe.nope.v1.NopeService", "typesafe.search.v1", "grpc.health.v1.Health"])(
    "unknown service %j fails with NOT_FOUND",
    async (service) => {
      const err = await client.check({ service }).then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
      expect(err?.code).toBe(Code.NotFound);
    },
  );
});

describe("Health.Watch", () => {
  it("sends the current status, then only changes, and stops when the caller goes away", async () => {
    const abort = new AbortController();
    const ended = once(serverStreams, "ended");
    const stream = client.watch({ service: "typesafe.search.v1.SearchService" }, { signal: abort.signal });
    const messages = stream[Symbol.asyncIterator]();

    expect((await messages.next()).value?.status).toBe(ServingStatus.SERVING);
    // Several unchanged polls must send nothing: the next message has to be the change.
    await checkRunsMore(3);
    verdict = false;
    expect((await messages.next()).value?.status).toBe(ServingStatus.NOT_SERVING);
    await checkRunsMore(3);
    verdict = new Error("database unreachable");
    await checkRunsMore(3);
    verdict = true;
    expect((await messages.next()).value?.status).toBe(ServingStatus.SERVING);

    abort.abort();
    expect(await ended).toEqual(["Watch"]);
  });

  it("answers SERVICE_UNKNOWN for an unknown service and keeps the call open", async () => {
    const abort = new AbortController();
    const ended = once(serverStreams, "ended");
    const messages = client.watch({ service: "typesafe.nope.v1.NopeService" }, { signal: abort.signal })[
      Symbol.asyncIterator
    ]();
    expect((await messages.next()).value?.status).toBe(ServingStatus.SERVICE_UNKNOWN);
    abort.abort();
    expect(await ended).toEqual(["Watch"]);
  });
});
