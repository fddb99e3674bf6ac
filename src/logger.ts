/**
 * A structured JSON logger: one line per event on stdout. Small on purpose;
 * callers pass fields, never request bodies or keys.
 */
export type LogLevel = "debug" | "info" | "warn" | "error";
const rank: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  child(fields: Record<string, unknown>): Logger;
}

export function createLogger(
  level: LogLevel | "silent" = "info",
  base: Record<string, unknown> = {},
  write: (line: string) => void = (line) => process.stdout.write(line + "\n"),
): Logger {
  const min = level === "silent" ? Infinity : rank[level];
  const log = (lvl: LogLevel, msg: string, fields?: Record<string, unknown>) => {
    if (rank[lvl] < min) return;
    write(JSON.stringify({ time: new Date().toISOString(), level: lvl, msg, ...base, ...fields }, errorReplacer));
  };
  return {
    debug: (m, f) => log("debug", m, f),
    info: (m, f) => log("info", m, f),
    warn: (m, f) => log("warn", m, f),
    error: (m, f) => log("error", m, f),
    child: (fields) => createLogger(level, { ...base, ...fields }, write),
  };
}

/** Errors log as name, message and cause; stack traces only where withStack asks for them. */
function errorReplacer(_key: string, value: unknown): unknown {
  if (value instanceof Error) {
    return { name: value.name, message: value.message, cause: value.cause };
  }
  return value;
}

/** An error with its stack trace, for the log of a bug (INTERNAL), where the stack is worth its lines. */
export function withStack(err: unknown): unknown {
  return err instanceof Error ? { name: err.name, message: err.message, stack: err.stack, cause: err.cause } : String(err);
}
