import { ZxcvbnFactory } from "@zxcvbn-ts/core";
import * as common from "@zxcvbn-ts/language-common";

/**
 * zxcvbn's score a new password must reach: 3 ("safely unguessable: moderate
 * protection from an offline slow-hash attack", under 10^10 guesses is 2).
 */
export const MIN_PASSWORD_SCORE = 3;
/**
 * zxcvbn's matching grows faster than linearly with the input; its authors
 * advise checking a prefix. A password this long is judged by its first
 * characters: the rest can only add strength.
 */
const CHECKED_CHARS = 100;

let factory: ZxcvbnFactory | undefined;

/**
 * Which strength rule a new password breaks, or undefined: its estimated
 * guesses (zxcvbn-ts, with its common-password list, keyboard patterns,
 * repeats, sequences and dates) must reach MIN_PASSWORD_SCORE. `userInputs`
 * (the member's email) count as known words.
 */
export function passwordStrengthProblem(password: string, userInputs: string[] = []): string | undefined {
  factory ??= new ZxcvbnFactory({ dictionary: { ...common.dictionary }, graphs: common.adjacencyGraphs });
  const words = userInputs.flatMap((input) => [input, ...input.split(/[@._+-]/)]).filter((word) => word.length > 2);
  const { score } = factory.check([...password].slice(0, CHECKED_CHARS).join(""), words);
  return score < MIN_PASSWORD_SCORE ? "too easy to guess: avoid common passwords, repeats, sequences and keyboard rows; a few unrelated words work well" : undefined;
}
