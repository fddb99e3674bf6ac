import { defineConfig } from "vitest/config";

/**
 * The tests `npm run mutate` runs against each mutant: the metering, answer
 * math and account-area suites, on the same database setup as `npm test`.
 */
export default defineConfig({
  test: {
    // The fast suites that pin the rules (crash: which commit may be lost in a crash); the HTTP, replica and shutdown suites reach the same code far more slowly.
    include: [
      "test/metering/{ledger,meter,meter-rules,metered-rpc,lost-replies,abandon-race,batch-lock-order,crash,admission-refusal,finish-with-retry,sweeper,key-limits,key-limits.surfaces,usage-rollup.rules,account-views}.test.ts",
      "test/db/{pooled-statement,statement-batcher}.test.ts",
      "test/decision/{answer-math*,calibration}.test.ts",
      "test/upstream/logprob-window.test.ts",
      // The evaluation math: hand-worked tables, the synthetic proof and the docs' worked example (the scikit-learn comparison needs python, so it stays in the polyglot suite).
      "test/evaluation/*.test.ts",
      "test/docs/evaluations-doc.test.ts",
      // The account area's rules: in-process servers, so every mutant is live in them (the CLI's tests spawn processes, where none is).
      "test/session-door/{rules,account.security,account.surfaces,account.happy,team,two-factor,defects.security,keys.limits,account.gateway}.test.ts",
      "test/keys/{keys-bounds,store,key-limits.rules}.test.ts",
      "test/sign-in/{password-work,two-factor.store}.test.ts",
      "test/team/member-removal.test.ts",
    ],
    globalSetup: ["test/support/global-setup.ts"],
    // As in npm test: every gateway answer is held against the OpenAPI document (account.gateway counts them).
    setupFiles: ["test/support/openapi-conformance.setup.ts"],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    maxWorkers: 2,
  },
});
