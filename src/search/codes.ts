import countries from "i18n-iso-countries";
import ISO6391 from "iso-639-1";

/**
 * Language and country codes of the `l` and `c` filters, checked against
 * maintained lists (iso-639-1, i18n-iso-countries) rather than a pattern,
 * and their English names, which some providers take or state instead of
 * codes (GDELT's `sourcelang:spanish`, an article's "language": "Spanish").
 */

/** An ISO 639-1 code as the contract writes it: two lower-case letters of the standard. */
export function isLanguageCode(code: string): boolean {
  return /^[a-z]{2}$/.test(code) && ISO6391.validate(code);
}

/** An ISO 3166-1 alpha-2 code as the contract writes it: two upper-case letters of the standard. */
export function isCountryCode(code: string): boolean {
  return /^[A-Z]{2}$/.test(code) && countries.isValid(code);
}

/** "es" → "Spanish". */
export function languageName(code: string): string {
  return ISO6391.getName(code);
}

const regionNames = new Intl.DisplayNames(["en"], { type: "region", fallback: "none" });

/** "GB" → "United Kingdom", the short English name (CLDR) news sources state. */
export function countryName(code: string): string {
  return regionNames.of(code) ?? code;
}

/** Letters only, lower case: how GDELT writes names in its operators ("unitedkingdom"). */
export function squashName(name: string): string {
  return name.toLowerCase().replace(/[^\p{L}]/gu, "");
}

let countryIndex: Map<string, string> | undefined;

/** The ISO code of an English country name ("United Kingdom" → "GB"), or undefined. */
export function countryCodeOfName(name: string): string | undefined {
  countryIndex ??= new Map(Object.keys(countries.getAlpha2Codes()).map((code) => [squashName(countryName(code)), code]));
  return countryIndex.get(squashName(name));
}

/** The ISO 639-1 code of an English language name ("Spanish" → "es"), or undefined. */
export function languageCodeOfName(name: string): string | undefined {
  const code = ISO6391.getCode(name.trim());
  return code === "" ? undefined : code;
}
