import fs from "node:fs";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { QUESTION_TYPES, validateDecideRequest } from "../../src/decision/validate.js";
import { DecideRequestSchema } from "../../src/gen/typesafe/decision/v1/decision_service_pb.js";

/**
 * The question types are one list: validation refuses any other type, naming
 * the list, and the OpenAPI document has one shape per type of that list.
 * (A type added to the list without its cases does not compile: see
 * QUESTION_TYPES in src/decision/validate.ts.)
 */
describe("the one list of question types", () => {
  it.each(["", "rank", "NOUL", "noul ", "QUESTION_TYPE_NOUL"])("refuses a question of type %j, naming every known type", (type) => {
    const request = create(DecideRequestSchema, { model: "typesafe/service-1.13", questions: { q: { type, instructions: "Is it?" } } });
    expect(validateDecideRequest(request)).toContainEqual({ field: "questions.q.type", rule: `must be one of ${QUESTION_TYPES.join(", ")}` });
  });

  it("the OpenAPI document has one question shape per type, told apart by `type`", () => {
    const document = JSON.parse(fs.readFileSync(path.resolve(import.meta.dirname, "../../src/gen/openapi.json"), "utf8"));
    const question = document.components.schemas["typesafe.decision.v1.Question"];
    expect(Object.keys(question.discriminator.mapping)).toEqual([...QUESTION_TYPES]);
    expect(question.oneOf).toHaveLength(QUESTION_TYPES.length);
    for (const type of QUESTION_TYPES) {
      expect(document.components.schemas[`typesafe.decision.v1.Question.${type}`].properties.type.enum).toEqual([type]);
    }
  });
});
