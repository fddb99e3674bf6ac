/**
 * One environment variable as the configuration reads it: the settings tables
 * of docs/ are made from these. Its own module so that the parsers config.ts
 * calls (the search catalog) can report what they read without importing
 * config.ts back.
 */
export interface SettingRead {
  name: string;
  default: string | undefined;
  /** In words, for a default that is not one value (it differs per search source). */
  defaultText?: string;
  range?: readonly [number, number];
}
