/**
 * A configuration that cannot be used, with every problem found. Its own module
 * so that the parsers config.ts calls (the search catalog) can throw it without
 * importing config.ts back.
 */
export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`invalid configuration:\n  ${problems.join("\n  ")}`);
    this.name = "ConfigError";
  }
}
