/**
 * The single-token symbols the upstream answers with, and how a returned
 * token maps back to one of them. Symbols never carry meaning of their own:
 * the prompt maps them to the caller's options, so multi-token option names
 * cost nothing and no option name is ever scored directly.
 */

/** A label set: the symbols in label order and the readout of one token. */
export interface LabelSet {
  symbols: string[];
  /**
   * The spellings of each symbol that count as it, as a model writes them
   * first (with and without a leading space): a model whose whole
   * distribution is at hand sums exactly these.
   */
  spellings: string[][];
  /** The label index a token stands for, or undefined when it is not a label. */
  indexOf(token: string): number | undefined;
}

/**
 * A token as the label it may stand for: leading whitespace and the raw
 * tokenizer markers of a leading space (`Ġ` in byte-level BPE, `▁` in
 * SentencePiece), which some servers return undecoded (vllm#16838), dropped.
 */
export function canonicalToken(token: string): string {
  return token.replace(/^[\sĠ▁]+/u, "").trimEnd();
}

/** Each spelling bare and after one space, the two ways a reply's first token carries it. */
function spaced(spellings: readonly string[]): string[] {
  return spellings.flatMap((s) => [s, ` ${s}`]);
}

const LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
/**
 * The letters without `I`, the first token of most refusals ("I can't…", "I'm
 * sorry…"): up to 25 labels never read a refusal as an answer. Only a call
 * over all 26 letters needs `I`.
 */
const LETTERS_BUT_I = "ABCDEFGHJKLMNOPQRSTUVWXYZ";
/** At most this many labels go into one call: the letters A-Z. */
export const MAX_LABELS_PER_CALL = LETTERS.length;
/** Up to this many score labels are digits; above, letters (multi-digit numbers split differently per tokenizer). */
export const MAX_DIGIT_LABELS = 10;

/** `yes` / `no`: case and leading-space variants all count (`Yes`, ` yes`, `YES`). */
export const NOUL_LABELS: LabelSet = {
  symbols: ["yes", "no"],
  spellings: [spaced(["yes", "Yes", "YES"]), spaced(["no", "No", "NO"])],
  indexOf(token) {
    const canon = canonicalToken(token).toLowerCase();
    if (canon === "yes") return 0;
    if (canon === "no") return 1;
    return undefined;
  },
};

/**
 * `A`, `B`, … for `count` labels, skipping `I` below 26 (`H` is followed by
 * `J`). Uppercase only: a lowercase `a` is an article opening a sentence, not
 * an answer.
 */
export function letterLabels(count: number): LabelSet {
  if (count < 1 || count > LETTERS.length) throw new RangeError(`letter labels: 1 to 26, got ${count}`);
  const letters = (count < LETTERS.length ? LETTERS_BUT_I : LETTERS).slice(0, count);
  return {
    symbols: [...letters],
    spellings: [...letters].map((l) => spaced([l])),
    indexOf(token) {
      const canon = canonicalToken(token);
      if (canon.length !== 1) return undefined;
      const index = letters.indexOf(canon);
      return index >= 0 ? index : undefined;
    },
  };
}

/** `0` … `count-1` for at most 10 labels. */
export function digitLabels(count: number): LabelSet {
  if (count < 1 || count > MAX_DIGIT_LABELS) throw new RangeError(`digit labels: 1 to 10, got ${count}`);
  return {
    symbols: Array.from({ length: count }, (_, i) => String(i)),
    spellings: Array.from({ length: count }, (_, i) => spaced([String(i)])),
    indexOf(token) {
      const canon = canonicalToken(token);
      if (!/^[0-9]$/.test(canon)) return undefined;
      const index = Number(canon);
      return index < count ? index : undefined;
    },
  };
}

/** Score labels: digits lowest first up to 10 levels, letters A (lowest) … for 11 to 26 (letterLabels). */
export function scoreLabels(count: number): LabelSet {
  return count <= MAX_DIGIT_LABELS ? digitLabels(count) : letterLabels(count);
}

/**
 * The order of a choice's options, which decides their letters. Option names
 * arrive as the keys of a JSON object (gateway) or of a protobuf map/Struct
 * (gRPC); both end up as a JavaScript object, whose key order is: integer-like
 * names ("0", "2", "10", canonical decimals below 2^32 - 1) first in ascending
 * numeric order, then every other name in the order the caller gave it. We
 * take that order as the canonical one and document it; the answer's
 * `probabilities` object is emitted in the same order.
 */
export function optionOrder(names: Iterable<string>): string[] {
  const object: Record<string, null> = {};
  for (const name of names) object[name] = null;
  return Object.keys(object);
}

/**
 * Splits `count` options, in order, into the fewest groups of at most
 * `perGroup` (26 letters, or a server's logprob cap), as evenly as possible
 * (27 options: 14 + 13). Returns option indexes per group.
 */
export function splitIntoGroups(count: number, perGroup = MAX_LABELS_PER_CALL): number[][] {
  const groupCount = Math.ceil(count / perGroup);
  const groups: number[][] = [];
  let next = 0;
  for (let g = 0; g < groupCount; g++) {
    const size = Math.floor(count / groupCount) + (g < count % groupCount ? 1 : 0);
    groups.push(Array.from({ length: size }, (_, i) => next + i));
    next += size;
  }
  return groups;
}
