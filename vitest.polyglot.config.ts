import { defineConfig } from "vitest/config";

/**
 * `npm run test:polyglot`: the Python and Go examples (examples/python,
 * examples/go) calling the real service. They need Debian's protoc and gRPC
 * packages, which `.ci/run` installs, so they stay out of `npm test`.
 */
export default defineConfig({
  test: {
    include: ["test/polyglot/**/*.test.ts"],
    globalSetup: ["test/support/global-setup.ts"],
    testTimeout: 90_000,
    hookTimeout: 60_000,
  },
});
