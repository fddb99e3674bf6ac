import { MAX_CHOICE_OPTIONS, MAX_KEY_LENGTH, MAX_QUESTIONS, MAX_SCORE_LABELS, QUESTION_TYPES, SUPPORTED_MODEL, type QuestionType } from "../decision/validate.js";
import { DecideRequestSchema, QuestionSchema } from "../gen/typesafe/decision/v1/decision_service_pb.js";
import { SearchRequestSchema } from "../gen/typesafe/search/v1/search_service_pb.js";
import { MAX_QUERY_CHARS, SOURCE_IDS, WINDOWS } from "../search/validate.js";
import { MAX_DOMAINS, SAFE_LEVELS } from "../search/filters.js";
import { MAX_EMAIL_CHARS } from "../team/members.js";
import { MAX_PASSWORD_CHARS, MIN_PASSWORD_CHARS } from "../sign-in/passwords.js";
import { MAX_KEY_NAME_CHARS } from "../keys/store.js";
import { MAX_SUMMARY_DAYS } from "../metering/account-views.js";
import { MAX_PAGE_SIZE, USAGE_ENDPOINTS } from "../metering/usage-query.js";
import { ROLES } from "../team/roles.js";
import { MAX_URL_LENGTH } from "../webhooks/endpoint-url.js";
import { MAX_THRESHOLDS } from "../webhooks/events.js";
import { MAX_THRESHOLD_CREDITS } from "../webhooks/thresholds.js";
import {
  AcceptInviteRequestSchema,
  AddWebhookEndpointRequestSchema,
  ConfirmTwoFactorEnrollmentRequestSchema,
  DisableTwoFactorRequestSchema,
  InviteMemberRequestSchema,
  ListKeysRequestSchema,
  ListWebhookDeliveriesRequestSchema,
  SetMemberRoleRequestSchema,
  SignInSecondStepRequestSchema,
  CreateKeyRequestSchema,
  GetUsageSummaryRequestSchema,
  ListActivityRequestSchema,
  KeyLimitsSchema,
  ListUsageRequestSchema,
  RollKeyRequestSchema,
  SignInRequestSchema,
  GetEvaluationRequestSchema,
  CancelEvaluationRequestSchema,
  ResumeEvaluationRequestSchema,
  DeleteEvaluationRequestSchema,
  GetEvaluationResultsRequestSchema,
  GetCalibrationRequestSchema,
  FitCalibrationRequestSchema,
  SetAlertsRequestSchema,
} from "../gen/typesafe/account/v1/account_service_pb.js";
import { KEY_BUDGET_PERIODS, KEY_SCOPES, MAX_ROLL_GRACE_SECONDS } from "../keys/key-limits.js";

/**
 * What a request message's validation adds to the shape its descriptor gives.
 * Proto3 cannot say that a field is required or bounded, so each request
 * message with rules names them here, taken from the validators' own
 * constants; a message without an entry is documented as proto3 JSON reads it
 * (every field optional, null meaning absent).
 */
type JsonSchema = Record<string, unknown>;

export interface RequestRules {
  /** Fields the validation refuses when absent, null or empty. */
  required?: string[];
  /** Keywords merged over a field's generated schema. */
  fields?: Record<string, JsonSchema>;
  /** Rules the service applies that JSON Schema cannot state, in words for the schema's description. */
  alsoRefused?: string;
  /**
   * For a message whose shape depends on one field's value: the shape for
   * each value, made from the merged schema. The document names each shape
   * and tells them apart by that field, as generators of typed clients expect.
   */
  variants?: { by: string; of: (schema: JsonSchema) => Record<string, JsonSchema> };
}

/** At least one character that is not whitespace: what the validators' `trim() !== ""` means. */
const NOT_BLANK = "\\S";

/** Printable (no control characters) and not blank, as question keys must be. */
const PRINTABLE_NOT_BLANK = "^[^\\p{Cc}]*[^\\s\\p{Cc}][^\\p{Cc}]*$";

/** A domain entry's outline: a host name, optionally led by "*.", without scheme, path or port. */
const DOMAIN_ENTRY = "^(\\*\\.)?[^*/:@\\s]+$";

/** A float or double sent as a string (protobuf-es reads it with Number() once it has no surrounding blanks). */
export const DECIMAL_STRING = "^(NaN|-?Infinity|[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?|0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+)$";

/** A page size of the account area's lists: 0 means the default. */
const PAGE_SIZE = { minimum: 0, maximum: MAX_PAGE_SIZE };

/** A key id filter: a key's id (a UUID), or empty for every key. */
const KEY_ID_FILTER = { pattern: "^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})?$" };

/** A page token is the service's own: JSON Schema cannot tell one it did not give. */
const PAGE_TOKEN_RULE = "a `page_token` this service did not give.";

/** The rules of each request message, by its full proto name. */
export const REQUEST_RULES: Record<string, RequestRules> = {
  [DecideRequestSchema.typeName]: {
    required: ["model", "state", "questions"],
    fields: {
      model: { enum: [SUPPORTED_MODEL] },
      state: { anyOf: [{ type: "string", pattern: NOT_BLANK }, { type: "object", minProperties: 1, additionalProperties: true }] },
      questions: {
        minProperties: 1,
        maxProperties: MAX_QUESTIONS,
        propertyNames: { minLength: 1, maxLength: MAX_KEY_LENGTH, pattern: PRINTABLE_NOT_BLANK },
      },
    },
    alsoRefused: `a question key longer than ${MAX_KEY_LENGTH} UTF-16 code units (characters outside the Basic Multilingual Plane count twice), and a question whose prompt with the state is too long for the model.`,
  },
  [QuestionSchema.typeName]: {
    required: ["type", "instructions"],
    fields: { instructions: { pattern: NOT_BLANK } },
    alsoRefused: "choice options or score labels that differ only in whitespace.",
    variants: { by: "type", of: questionVariants },
  },
  [SearchRequestSchema.typeName]: {
    required: ["q"],
    fields: {
      q: { minLength: 1, maxLength: MAX_QUERY_CHARS, pattern: NOT_BLANK },
      s: { minItems: 1, uniqueItems: true, items: { type: "string", enum: [...SOURCE_IDS] } },
      // proto3 JSON reads "" as absent, so the default window.
      w: { enum: ["", ...WINDOWS] },
      d: { maxItems: MAX_DOMAINS, uniqueItems: true, items: { type: "string", minLength: 1, pattern: DOMAIN_ENTRY } },
      xd: { maxItems: MAX_DOMAINS, uniqueItems: true, items: { type: "string", minLength: 1, pattern: DOMAIN_ENTRY } },
      l: { pattern: "^([a-z]{2})?$" },
      c: { pattern: "^([A-Z]{2})?$" },
      safe: { enum: ["", ...SAFE_LEVELS] },
    },
    alsoRefused:
      "a window `w` that none of the chosen sources can filter by (GET /api/v1/sources tells which can); " +
      "a `d` or `xd` entry that is a public suffix (`com`, `co.uk`), an IP address or not a host name; the same domain in `d` and `xd`, or a `d` entry inside an `xd` one; " +
      "an `l` that is not an ISO 639-1 code or a `c` that is not an ISO 3166-1 alpha-2 code; a `safe` below the deployment's minimum; " +
      "and filters that leave none of the chosen sources anything to search.",
  },
  [AcceptInviteRequestSchema.typeName]: {
    required: ["invite_token", "password"],
    fields: { invite_token: { minLength: 1 }, password: { minLength: MIN_PASSWORD_CHARS, maxLength: MAX_PASSWORD_CHARS } },
  },
  [SignInRequestSchema.typeName]: {
    required: ["email", "password"],
    fields: { email: { minLength: 1, maxLength: MAX_EMAIL_CHARS }, password: { minLength: 1, maxLength: MAX_PASSWORD_CHARS } },
    alsoRefused: "an email that is blank once trimmed.",
  },
  [SignInSecondStepRequestSchema.typeName]: {
    required: ["second_step_token"],
    fields: { second_step_token: { minLength: 1 }, code: { maxLength: 16 }, recovery_code: { maxLength: 32 } },
    alsoRefused: "both or neither of `code` and `recovery_code`.",
  },
  [InviteMemberRequestSchema.typeName]: {
    required: ["email"],
    // proto3 JSON reads "" as absent: the default role, member.
    fields: { email: { minLength: 1, maxLength: MAX_EMAIL_CHARS }, role: { enum: ["", ...ROLES] } },
    alsoRefused: "an email that is not `name@domain` once trimmed.",
  },
  [SetMemberRoleRequestSchema.typeName]: {
    required: ["role"],
    fields: { role: { enum: [...ROLES] } },
  },
  [ConfirmTwoFactorEnrollmentRequestSchema.typeName]: {
    required: ["code"],
    fields: { code: { minLength: 1, maxLength: 16 } },
    alsoRefused: "a code that is not a current one of the secret being enrolled.",
  },
  [DisableTwoFactorRequestSchema.typeName]: {
    alsoRefused: "both or neither of `code` and `recovery_code`.",
  },
  [AddWebhookEndpointRequestSchema.typeName]: {
    required: ["url"],
    fields: { url: { minLength: 1, maxLength: MAX_URL_LENGTH } },
    alsoRefused: "a URL that is not absolute http:// or https://, holds credentials or a fragment, or names a private, loopback or otherwise non-public address.",
  },
  [ListKeysRequestSchema.typeName]: {
    fields: { page_size: PAGE_SIZE },
    alsoRefused: PAGE_TOKEN_RULE,
  },
  [ListWebhookDeliveriesRequestSchema.typeName]: {
    fields: { page_size: { minimum: 0, maximum: 100 } },
  },
  [CreateKeyRequestSchema.typeName]: {
    fields: { name: { maxLength: MAX_KEY_NAME_CHARS } },
    alsoRefused: `a name with control or format characters (after trimming), or longer than ${MAX_KEY_NAME_CHARS} characters once trimmed.`,
  },
  [KeyLimitsSchema.typeName]: {
    fields: {
      scopes: { items: { type: "string", enum: [...KEY_SCOPES] } },
      budget_credits: { minimum: 0 },
      // proto3 JSON reads "" as absent: no budget.
      budget_period: { enum: ["", ...KEY_BUDGET_PERIODS] },
      requests_per_minute: { minimum: 0 },
    },
    alsoRefused:
      "an `expires_at` that is not in the future, a `budget_credits` finer than 0.000001, a `budget_credits` without a `budget_period` or the reverse, " +
      "and `requests_per_minute` above the account's own (GetAccount's `limits.requests_per_minute`).",
  },
  [RollKeyRequestSchema.typeName]: {
    fields: { old_key_expires_in_seconds: { minimum: 0, maximum: MAX_ROLL_GRACE_SECONDS } },
  },
  [ListUsageRequestSchema.typeName]: {
    fields: { endpoint: { enum: ["", ...USAGE_ENDPOINTS] }, page_size: PAGE_SIZE, key_id: KEY_ID_FILTER },
    alsoRefused: `\`since\` at or after \`until\`, and ${PAGE_TOKEN_RULE}`,
  },
  [GetUsageSummaryRequestSchema.typeName]: {
    fields: { granularity: { enum: ["", "day", "hour"] }, key_id: KEY_ID_FILTER },
    alsoRefused: `\`since\` at or after \`until\`, and a range wider than ${MAX_SUMMARY_DAYS.day} days per day or ${MAX_SUMMARY_DAYS.hour} days per hour.`,
  },
  [ListActivityRequestSchema.typeName]: {
    fields: { page_size: PAGE_SIZE },
    alsoRefused: PAGE_TOKEN_RULE,
  },
  [GetEvaluationRequestSchema.typeName]: { required: ["evaluation_id"] },
  [CancelEvaluationRequestSchema.typeName]: { required: ["evaluation_id"] },
  [ResumeEvaluationRequestSchema.typeName]: { required: ["evaluation_id"], fields: { credit_cap_credits: { minimum: 0 } } },
  [DeleteEvaluationRequestSchema.typeName]: { required: ["evaluation_id"] },
  [GetEvaluationResultsRequestSchema.typeName]: { required: ["evaluation_id"] },
  [GetCalibrationRequestSchema.typeName]: { required: ["calibration_id"] },
  [FitCalibrationRequestSchema.typeName]: { required: ["evaluation_id", "question_key"] },
  [SetAlertsRequestSchema.typeName]: {
    fields: { thresholds_credits: { maxItems: MAX_THRESHOLDS, items: { type: ["number", "string"], pattern: DECIMAL_STRING, exclusiveMinimum: 0, maximum: MAX_THRESHOLD_CREDITS } } },
    alsoRefused: "a threshold finer than 0.000001 credits, or one sent as a string that is not a number in that range.",
  },
};

/** A question is one shape per type of QUESTION_TYPES, told apart by `type`: criteria belong to choice and score only. */
function questionVariants(schema: JsonSchema): Record<string, JsonSchema> {
  const properties = schema["properties"] as Record<string, JsonSchema>;
  const criteria = properties["criteria"] ?? {};
  const variant = (type: string, criteriaSchema: JsonSchema | undefined): JsonSchema => ({
    type: "object",
    required: criteriaSchema ? ["type", "instructions", "criteria"] : ["type", "instructions"],
    additionalProperties: false,
    properties: {
      type: { ...properties["type"], enum: [type] },
      instructions: properties["instructions"],
      criteria: criteriaSchema ? { ...criteria, ...criteriaSchema } : { ...criteria, type: "null" },
      calibration: { ...properties["calibration"], pattern: "^(|contextual|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$" },
    },
  });
  // Keyed by every type of the one list: a type without its criteria schema fails to compile.
  const criteriaOf: Record<QuestionType, JsonSchema | undefined> = {
    noul: undefined,
    choice: {
      type: "object",
      minProperties: 2,
      maxProperties: MAX_CHOICE_OPTIONS,
      propertyNames: { pattern: NOT_BLANK },
      additionalProperties: { type: "null" },
    },
    score: { type: "array", minItems: 2, maxItems: MAX_SCORE_LABELS, uniqueItems: true, items: { type: "string", pattern: NOT_BLANK } },
  };
  return Object.fromEntries(QUESTION_TYPES.map((type) => [type, variant(type, criteriaOf[type])]));
}
