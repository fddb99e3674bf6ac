import http from "node:http";
import type { AddressInfo } from "node:net";
import { loadConfig, type LlmConfig } from "../../src/config.js";

/**
 * A real OpenAI-compatible Chat Completions server on 127.0.0.1 (port 0),
 * scripted per test. It records every request it receives, so tests assert on
 * the exact bodies the service sent; replies use the real response shape
 * (`choices[0].logprobs.content[0].top_logprobs`, `usage` with
 * `prompt_tokens_details.cached_tokens`), as OpenAI's API reference gives the
 * chat completion object: https://platform.openai.com/docs/api-reference/chat/object
 */

export interface ChatBody {
  model?: string;
  messages: Array<{ role: string; content: string }>;
  max_tokens?: number;
  max_completion_tokens?: number;
  logprobs?: boolean;
  top_logprobs?: number;
  temperature?: number;
  top_p?: number;
  response_format?: { type: string; json_schema?: { schema?: { required?: string[] } } };
  chat_template_kwargs?: Record<string, unknown>;
  [field: string]: unknown;
}

export interface ReceivedRequest {
  path: string;
  headers: http.IncomingHttpHeaders;
  /** The parsed body; undefined when it was not JSON. */
  body: ChatBody;
  raw: string;
  /** Resolves if the client closes the connection before the reply was sent (the call was cancelled). */
  cancelled: Promise<void>;
}

export interface FakeReply {
  status?: number;
  /** Serialized as the body; `text` wins when both are given. */
  json?: unknown;
  text?: string;
  headers?: Record<string, string>;
  /** The reply waits for this (a deferred the test resolves), or forever if it never settles. */
  hold?: Promise<unknown>;
  /** Answer after this many ms: for benches and tests that measure time spent upstream. Tests synchronize with `hold`, not time. */
  delayMs?: number;
}

export type FakeHandler = (request: ReceivedRequest, index: number) => FakeReply | Promise<FakeReply>;

export interface FakeLlm {
  /** http://127.0.0.1:<port>; the service's base URL is `${url}/v1`. */
  url: string;
  /** Every request received, probes included, in arrival order. */
  requests: ReceivedRequest[];
  /** Requests that are not the capability probe. */
  questionRequests(): ReceivedRequest[];
  setHandler(handler: FakeHandler): void;
  /** Called after each request is recorded. */
  onRequestArrived?: () => void;
  /** Called when the client (the service) drops a request before its reply was sent. */
  onRequestClosed?: () => void;
  /** Resolves once `count` requests in total have arrived. */
  received(count: number): Promise<void>;
  close(): Promise<void>;
}

export async function startFakeLlm(handler: FakeHandler = defaultHandler): Promise<FakeLlm> {
  let current = handler;
  const requests: ReceivedRequest[] = [];
  const waiters: Array<{ count: number; resolve: () => void }> = [];
  const server = http.createServer((req, res) => {
    res.on("close", () => {
      if (!res.writableFinished) fake.onRequestClosed?.();
    });
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const raw = Buffer.concat(chunks).toString("utf8");
      let body: ChatBody;
      try {
        body = JSON.parse(raw) as ChatBody;
      } catch {
        body = { messages: [] };
      }
      const cancelled = new Promise<void>((resolve) => res.on("close", () => !res.writableFinished && resolve()));
      const request: ReceivedRequest = { path: req.url ?? "", headers: req.headers, body, raw, cancelled };
      const index = requests.push(request) - 1;
      fake.onRequestArrived?.();
      for (const w of [...waiters]) {
        if (requests.length >= w.count) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve();
        }
      }
      void (async () => {
        const reply = await current(request, index);
        if (reply.hold) await reply.hold;
        if (reply.delayMs) await new Promise((r) => setTimeout(r, reply.delayMs));
        if (res.destroyed) return;
        const text = reply.text ?? JSON.stringify(reply.json ?? {});
        res.writeHead(reply.status ?? 200, { "content-type": "application/json", ...reply.headers });
        res.end(text);
      })().catch(() => res.destroy());
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  const fake: FakeLlm = {
    url: `http://127.0.0.1:${port}`,
    requests,
    questionRequests: () => requests.filter((r) => !isProbe(r.body)),
    setHandler(next) {
      current = next;
    },
    received(count) {
      if (requests.length >= count) return Promise.resolve();
      return new Promise((resolve) => waiters.push({ count, resolve }));
    },
    close() {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
  return fake;
}

/** The client's config pointed at `fake`, with a generous deadline and no retries unless `overrides` say otherwise. */
export function fakeLlmConfig(fake: FakeLlm, overrides: Partial<LlmConfig> = {}): LlmConfig {
  return {
    baseUrl: `${fake.url}/v1`,
    apiKey: undefined,
    model: "fake-model",
    requestTimeoutMs: 5_000,
    callTimeoutMs: 2_000,
    maxConcurrentCalls: 8,
    maxRetries: 0,
    embedded: loadConfig({ TYPESAFE_LLM_EMBEDDED: "off" }).llm.embedded,
    ...overrides,
  };
}

/** The capability probe the client sends before its first question. */
export function isProbe(body: ChatBody): boolean {
  return body.messages?.[0]?.content?.startsWith("Capability check") ?? false;
}

export interface UsageInit {
  prompt?: number;
  cached?: number;
  completion?: number;
}

function usage(init: UsageInit = {}) {
  const prompt = init.prompt ?? 100;
  const completion = init.completion ?? 1;
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    prompt_tokens_details: { cached_tokens: init.cached ?? 0 },
  };
}

/** A chat.completion object with one choice and its usage. */
function completion(choice: Record<string, unknown>, init: UsageInit): FakeReply {
  return {
    json: {
      id: "chatcmpl-fake",
      object: "chat.completion",
      created: 1_700_000_000,
      model: "fake-model",
      choices: [{ index: 0, ...choice }],
      usage: usage(init),
    },
  };
}

/**
 * A max_tokens-1 completion whose first-position window holds `probabilities`
 * (token → probability, as given; the sampled token is the most probable one).
 * As entries, one token string may appear twice, as servers that decode two
 * pieces alike return it (vllm#44319, sglang#32290).
 */
export function logprobsReply(
  probabilities: Record<string, number> | ReadonlyArray<readonly [string, number]>,
  init: UsageInit & { refusal?: string } = {},
): FakeReply {
  const entries = (Array.isArray(probabilities) ? [...probabilities] : Object.entries(probabilities)).sort((a, b) => b[1] - a[1]);
  const top = entries.map(([token, p]) => ({ token, logprob: p > 0 ? Math.log(p) : -9999, bytes: [...Buffer.from(token)] }));
  const first = top[0] ?? { token: "", logprob: 0, bytes: [] };
  return completion(
    {
      message: { role: "assistant", content: first.token, refusal: init.refusal ?? null },
      logprobs: { content: [{ ...first, top_logprobs: top }], refusal: null },
      finish_reason: "length",
    },
    init,
  );
}

/** A completion without logprobs (the verbalized path, or a server that ignores the field). */
export function textReply(content: string, init: UsageInit & { logprobs?: unknown } = {}): FakeReply {
  return completion({ message: { role: "assistant", content }, logprobs: init.logprobs ?? null, finish_reason: "stop" }, init);
}

/** The reply of a healthy logprobs server to the probe. */
export const PROBE_OK = logprobsReply({ yes: 0.9, Yes: 0.06, no: 0.04 }, { prompt: 20 });

/** Answers the probe, then every question with `yes` at 0.8 (variants included). */
export const defaultHandler: FakeHandler = (request) =>
  isProbe(request.body) ? PROBE_OK : logprobsReply({ yes: 0.6, " yes": 0.2, no: 0.15, maybe: 0.05 });

/** Answers the probe, then each question with P(yes) 0.8 when its state mentions "refund", else 0.3: an evaluation's labelled states get known answers. */
export const refundHandler: FakeHandler = (request) => {
  if (isProbe(request.body)) return PROBE_OK;
  const p = userContent(request).includes("refund") ? 0.8 : 0.3;
  return logprobsReply({ yes: p, no: 1 - p }, { prompt: 90 });
};

/** The user message of a request: the state block, then the question block. */
export function userContent(request: ReceivedRequest): string {
  return request.body.messages.find((m) => m.role === "user")?.content ?? "";
}

/**
 * Answers the probe as a healthy logprobs server, then each question by the
 * first marker its user message contains; the route gets how many questions
 * that marker has taken, this one included. An unrouted question gets a 400,
 * which the client does not retry, so a missing route fails the test.
 */
export function routeByMarker(routes: Record<string, (request: ReceivedRequest, n: number) => FakeReply | Promise<FakeReply>>): FakeHandler {
  const taken = new Map<string, number>();
  return (request) => {
    if (isProbe(request.body)) return PROBE_OK;
    const text = userContent(request);
    const marker = Object.keys(routes).find((k) => text.includes(k));
    if (marker === undefined) return { status: 400, text: "no route" };
    const n = (taken.get(marker) ?? 0) + 1;
    taken.set(marker, n);
    return routes[marker]!(request, n);
  };
}

/** A promise with its resolve, to hold a reply open until the test lets it go. */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/** vLLM's error body (vllm/entrypoints/openai/protocol.py ErrorResponse) for a request over --max-logprobs (vllm/v1/engine/processor.py). */
export function vllmMaxLogprobs(requested: number, allowed: number): FakeReply {
  return {
    status: 400,
    json: { object: "error", message: `Requested sample logprobs of ${requested}, which is greater than max allowed: ${allowed}`, type: "BadRequestError", param: null, code: 400 },
  };
}
