import { defineConfig } from "vitest/config";

/**
 * `npm run test:polyglot`: the Python and Go examples (examples/python,
 * examples/go) calling the real service, and the evaluation math held against
 * scikit-learn. They need Debian's protoc, gRPC and python3-sklearn packages,
 * which `.ci/run` installs, so they stay out of `npm test`.
 */
export default defineConfig({
  test: {
    include: ["test/polyglot/**/*.test.ts"],
    globalSetup: ["test/support/build-setup.ts", "test/support/global-setup.ts"],
    testTimeout: 90_000,
    hookTimeout: 60_000,
  },
});
