import type { FakeReply } from "./server.js";

/**
 * Error answers of the search providers, each copied from the provider's
 * documentation or from a response recorded in a public issue, named next to
 * it. Only ids and timestamps are replaced; wording, codes, statuses and
 * headers are as recorded.
 */

// ---------------------------------------------------------------- brave

/**
 * Brave's rate headers: one value per policy window (per second, per month).
 * Shape and example values from Brave's API docs, "Response headers"
 * (api-dashboard.search.brave.com/app/documentation/web-search/response-headers,
 * quoted in modelcontextprotocol/servers#596): `X-RateLimit-Reset: 1, 1419704`.
 * Brave documents no Retry-After.
 */
export function braveRateHeaders(remaining: [number, number], reset: [number, number]): Record<string, string> {
  return {
    "x-ratelimit-limit": "1, 15000",
    "x-ratelimit-policy": "1;w=1, 15000;w=2592000",
    "x-ratelimit-remaining": `${remaining[0]}, ${remaining[1]}`,
    "x-ratelimit-reset": `${reset[0]}, ${reset[1]}`,
  };
}

/** A wrong key: HTTP 422, code SUBSCRIPTION_TOKEN_INVALID (nearai/ironclaw#2780: "Brave API error (HTTP 422): {"error":{"code":"SUBSCRIPTION_TOKEN_INVA…"). */
export const BRAVE_TOKEN_INVALID: FakeReply = {
  status: 422,
  headers: { "content-type": "application/json" },
  body: {
    type: "ErrorResponse",
    error: {
      id: "4b1d6a52-0c3e-4b07-9b1e-6b8f1e2f0c11",
      status: 422,
      code: "SUBSCRIPTION_TOKEN_INVALID",
      detail: "The provided subscription token is invalid.",
      meta: { component: "authentication" },
    },
    time: 1773685964,
  },
};

/** A request Brave cannot validate (e.g. over 50 words): egoist/chatwise-releases#936, recorded verbatim. */
export const BRAVE_VALIDATION: FakeReply = {
  status: 422,
  headers: { "content-type": "application/json" },
  body: { type: "ErrorResponse", error: { id: "ade84851-a6f3-4cf9-8c76-1dc897718b0b", status: 422, code: "VALIDATION", detail: "Unable to validate request parameter(s)", meta: {} }, time: 1754364294 },
};

/** The per-second limit: body recorded in egoist/chatwise-releases#1296; headers per Brave's "Response headers" docs (second window spent, resets in 1 s). */
export const BRAVE_RATE_LIMITED: FakeReply = {
  status: 429,
  headers: { "content-type": "application/json", ...braveRateHeaders([0, 1985], [1, 1419704]) },
  body: {
    type: "ErrorResponse",
    error: {
      id: "redacted",
      status: 429,
      detail: "Request rate limit exceeded for plan",
      meta: { plan: "Free", rate_limit: 1, rate_current: 1, quota_limit: 2000, quota_current: 15, org_rate_limit: null, org_rate_current: 0, component: "rate_limiter" },
      code: "RATE_LIMITED",
    },
    time: 1773685964,
  },
};

/**
 * The plan's monthly quota used up: code QUOTA_LIMITED (Brave API docs,
 * "Error codes"; same ErrorResponse shape as RATE_LIMITED above). The month
 * window has 0 remaining and resets in 1419704 s (the docs' example value).
 */
export const BRAVE_QUOTA_LIMITED: FakeReply = {
  status: 429,
  headers: { "content-type": "application/json", ...braveRateHeaders([1, 0], [1, 1419704]) },
  body: {
    type: "ErrorResponse",
    error: {
      id: "redacted",
      status: 429,
      detail: "Request quota limit exceeded for plan",
      meta: { plan: "Free", rate_limit: 1, rate_current: 0, quota_limit: 2000, quota_current: 2000, org_rate_limit: null, org_rate_current: 0, component: "rate_limiter" },
      code: "QUOTA_LIMITED",
    },
    time: 1773685964,
  },
};

// ---------------------------------------------------------------- github

/**
 * A secondary rate limit without Retry-After: 403, x-ratelimit-remaining not
 * 0. Message and documentation_url from docs.github.com "Rate limits for the
 * REST API" (#about-secondary-rate-limits): "If you exceed a secondary rate
 * limit … you will receive a 403 or 429 response … wait for at least one minute".
 */
export const GITHUB_SECONDARY_LIMIT: FakeReply = {
  status: 403,
  headers: {
    "content-type": "application/json; charset=utf-8",
    "x-ratelimit-limit": "30",
    "x-ratelimit-remaining": "27",
    "x-ratelimit-reset": "1795413660",
    "x-ratelimit-resource": "search",
  },
  body: {
    message: "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach out to GitHub Support for help, please include the request ID 0C5A:3B5F:1E2D4:3F8A1:6741A2B3.",
    documentation_url: "https://docs.github.com/free-pro-team@latest/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits",
  },
};

// ---------------------------------------------------------------- gdelt

/**
 * GDELT's rate notice as HTTP 200 plain text: the same sentence as its 429
 * (clients check `'limit requests' not in response.text` on 200 answers:
 * shafqatgreat/PythonFreeAPIs news.py).
 */
export const GDELT_200_NOTICE: FakeReply = {
  status: 200,
  headers: { "content-type": "text/plain; charset=utf-8" },
  body: "Please limit requests to one every 5 seconds or contact kalev.leetaru5@gmail.com for larger queries.",
};

/**
 * An ArtList answer with an invalid JSON escape (`\'`) in a title, which
 * gdelt-doc-api's helpers.load_json exists to repair. Written as raw text so
 * the bad escape reaches the client.
 */
export function gdeltBadEscapeBody(seendate: string): string {
  return `{"articles": [ {"url": "https://www.reuters.com/world/europe/ukraine-talks-2026-11-22/", "url_mobile": "", "title": "Ukraine\\'s talks resume in Geneva", "seendate": "${seendate}", "socialimage": "", "domain": "reuters.com", "language": "English", "sourcecountry": "United States"} ] }`;
}

// ---------------------------------------------------------------- exa

/** Exa's error body: `requestId`, `error`, `tag` (exa.ai/docs/admin/error-codes, "Error response structure"). */
export const EXA_INVALID_REQUEST_BODY: FakeReply = {
  status: 400,
  headers: { "content-type": "application/json" },
  body: { requestId: "b2c9f0e1a4d3", error: "Invalid request body: query must be a non-empty string", tag: "INVALID_REQUEST_BODY" },
};

/** 402, credits exhausted: tag NO_MORE_CREDITS (exa.ai/docs/admin/error-codes, "Account, billing, and access"). */
export const EXA_NO_MORE_CREDITS: FakeReply = {
  status: 402,
  headers: { "content-type": "application/json" },
  body: { requestId: "5e7a1c2b9d80", error: "You have run out of credits. Top up at dashboard.exa.ai", tag: "NO_MORE_CREDITS" },
};

// ---------------------------------------------------------------- wikipedia

/** Wikimedia's User-Agent block, text recorded in dracor-org/dracor-api#332. */
export const WIKIPEDIA_UA_BLOCK: FakeReply = {
  status: 403,
  headers: { "content-type": "text/plain" },
  body: "Please set a user-agent and respect our robot policy https://w.wiki/4wJS. See also T400119.\n",
};
