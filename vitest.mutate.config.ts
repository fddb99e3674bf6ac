import { defineConfig } from "vitest/config";

/**
 * The tests `npm run mutate` runs against each mutant: the metering and answer
 * math suites, on the same database setup as `npm test`.
 */
export default defineConfig({
  test: {
    include: ["test/metering/*.test.ts", "test/decision/answer-math*.test.ts"],
    globalSetup: ["test/support/global-setup.ts"],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    maxWorkers: 2,
  },
});
