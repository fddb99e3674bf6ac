/**
 * Money is integer units: 1 unit = 1 input token, 1 credit = 1,000,000 units.
 * Credits appear only at the edges (CLI input, JSON output).
 */
export const UNITS_PER_CREDIT = 1_000_000;

/** Credits for display; exact for every unit count below 2^53. */
export function unitsToCredits(units: number): number {
  return units / UNITS_PER_CREDIT;
}

/** Parses a decimal credit amount ("1.5", "0.000001") into units without floating point. */
export function parseCredits(text: string): number {
  const match = /^(\d+)(?:\.(\d{1,6}))?$/.exec(text.trim());
  if (!match) throw new Error(`"${text}" is not a credit amount (a decimal with at most 6 fraction digits)`);
  const units = BigInt(match[1]!) * BigInt(UNITS_PER_CREDIT) + BigInt((match[2] ?? "").padEnd(6, "0"));
  if (units > BigInt(Number.MAX_SAFE_INTEGER)) throw new Error(`"${text}" is too large`);
  return Number(units);
}

/**
 * A credit amount sent as a number (a JSON double) in units, or undefined
 * when it is not one: the number's shortest decimal form must be a credit
 * amount as parseCredits reads it, so 5e-324 or a seventh decimal is refused
 * instead of rounded away.
 */
export function creditsNumberToUnits(credits: number): number | undefined {
  if (!Number.isFinite(credits)) return undefined;
  try {
    return parseCredits(String(credits));
  } catch {
    return undefined;
  }
}
