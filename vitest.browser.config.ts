import { defineConfig } from "vitest/config";

/**
 * `npm run test:browser`: the account page in Debian's chromium, driven by
 * playwright-core, against the real service. It needs the chromium package,
 * which `.ci/run` installs, so it stays out of `npm test`.
 */
export default defineConfig({
  test: {
    include: ["test/browser/**/*.test.ts"],
    globalSetup: ["test/support/build-setup.ts", "test/support/global-setup.ts"],
    // Every gateway answer a test receives must match the OpenAPI document.
    setupFiles: ["test/support/openapi-conformance.setup.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
  },
});
