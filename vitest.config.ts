import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Other languages' clients need Debian packages: `npm run test:polyglot` (vitest.polyglot.config.ts);
    // the browser test needs Debian's chromium: `npm run test:browser` (vitest.browser.config.ts).
    exclude: ["test/polyglot/**", "test/browser/**", "**/node_modules/**"],
    globalSetup: ["test/support/build-setup.ts", "test/support/global-setup.ts"],
    // Every gateway answer a test receives must match the OpenAPI document.
    setupFiles: ["test/support/openapi-conformance.setup.ts"],
    reporters: ["default", "./test/support/summary-reporter.ts"],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // Two cores: more workers only add contention.
    maxWorkers: 2,
  },
});
