import { startApp } from "./app.js";
import { ConfigError } from "./config-error.js";
import { loadConfig } from "./config.js";
import { createLogger } from "./logger.js";

/** The only entry point: config, dependencies, server, and a graceful stop on SIGTERM/SIGINT. */
async function main(): Promise<void> {
  let config;
  try {
    config = loadConfig();
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(err.message + "\n");
      process.exit(2);
    }
    throw err;
  }
  const logger = createLogger(config.logLevel, { service: "typesafe" });
  const app = await startApp(config, logger);
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    logger.info("signal received", { signal });
    app.stop().then(
      () => process.exit(0),
      (err: unknown) => {
        logger.error("shutdown failed", { error: err instanceof Error ? err : String(err) });
        process.exit(1);
      },
    );
  };
  process.on("SIGTERM", () => stop("SIGTERM"));
  process.on("SIGINT", () => stop("SIGINT"));
}

main().catch((err: unknown) => {
  process.stderr.write(`typesafe failed to start: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
