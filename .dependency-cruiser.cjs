/**
 * The import rules of src/, checked by `npm run lint:deps` (dependency-cruiser) in CI.
 *
 * The rooms, from the outside in:
 *   doors     gateway/, rpc/, session-door/, web/   take calls from the network
 *   features  decision/, search/, webhooks/   the work a call asks for, and what an account hears of it
 *   metering/                            admit, settle and release money
 *   call/                                one call's context: request id, phases, the caller's API key
 *   keys/, team/, sign-in/, db/          API keys, members, sign-in, the store
 * A room may import the rooms below it, never one above. upstream/ talks to
 * the LLM upstream or runs the in-process model; it knows nothing of the
 * work it serves. The composition root (app.ts,
 * main.ts, server.ts, build.mjs) wires the doors; nothing else imports a door
 * but another door: the gateway and the session door's CSV download build on
 * rpc/, and rpc/ on no other door. Shared
 * modules at the top of src/ (errors, logger, metrics, validation, ...) may be
 * imported from any room. No module imports itself back through others, and
 * nothing in src/ imports test/ or bench/.
 *
 * A rule that must bend for a while gets a `.dependency-cruiser-known-violations.json`
 * (`depcruise --output-type baseline`) and `--ignore-known`; today there is none.
 *
 * Only config.ts reads process.env: dependency-cruiser cannot see that, so
 * test/config/environment-reader.test.ts checks it.
 */

const ROOT = "^src/(app\\.ts|main\\.ts|server\\.ts|build\\.mjs)$";
const DOORS = "^src/(gateway|rpc|session-door|web)/";
const FEATURES = "^src/(decision|search|webhooks)/";
const METERING = "^src/metering/";
const STORE = "^src/(keys|team|sign-in|db)/";
const UPSTREAM = "^src/upstream/";
/** What every layer reads about the call in progress; below the doors and the features. */
const CALL = "^src/call/";
/** The OpenAPI document describes the gateway, so it reads the gateway's path table. */
const OPENAPI = "^src/openapi/";
/** The evaluation math: pure functions of numbers, run by the evaluation runner and on the decision path alike. */
const EVALUATION_MATH = "^src/evaluation/(metrics|calibration-fit|calibration-apply|seeded-random)\\.ts$";

/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: "no-circular",
      severity: "error",
      comment: "Modules that import each other cannot be read, tested or moved one at a time.",
      from: { path: "^src/", pathNot: "^src/gen/" },
      to: { circular: true },
    },
    {
      name: "doors-only-from-the-root",
      severity: "error",
      comment: "Only the composition root wires the doors; features and everything below never reach up into them.",
      from: { path: "^src/", pathNot: [ROOT, DOORS, OPENAPI] },
      to: { path: DOORS },
    },
    {
      name: "rpc-not-gateway",
      severity: "error",
      comment:
        "The gateway translates JSON into the same RPC routes and interceptors, so it builds on rpc/; " +
        "rpc/ importing gateway/ would make the two doors one knot (a folder-level cycle no-circular cannot see).",
      from: { path: "^src/rpc/" },
      to: { path: "^src/gateway/" },
    },
    {
      name: "features-apart",
      severity: "error",
      comment: "decision/, search/ and webhooks/ are peers: none builds on another.",
      from: { path: FEATURES },
      to: { path: FEATURES, pathNot: "^src/$1/" },
    },
    {
      name: "metering-below-features",
      severity: "error",
      comment: "Metering serves every feature, so it knows none of them.",
      from: { path: METERING },
      to: { path: FEATURES },
    },
    {
      name: "call-below-the-work",
      severity: "error",
      comment: "The call's context is read by doors, features and metering alike, so it knows none of them.",
      from: { path: CALL },
      to: { path: [DOORS, FEATURES, METERING, UPSTREAM] },
    },
    {
      name: "store-below-metering",
      severity: "error",
      comment: "keys/, team/, sign-in/ and db/ hold rows; money (metering) and work (features) build on them, not the reverse.",
      from: { path: STORE },
      to: { path: [FEATURES, METERING, UPSTREAM, CALL] },
    },
    {
      name: "upstream-knows-no-work",
      severity: "error",
      comment: "upstream/ talks to the outside; what the answers mean is the features' business.",
      from: { path: UPSTREAM },
      to: { path: [FEATURES, METERING, STORE] },
    },
    {
      name: "evaluation-math-pure",
      severity: "error",
      comment: "Metrics and calibration are pure math: they import only each other, so any room may use them and mutation testing covers them alone.",
      from: { path: EVALUATION_MATH },
      to: { pathNot: EVALUATION_MATH },
    },
    {
      name: "src-not-tests",
      severity: "error",
      comment: "The service never ships test or bench code.",
      from: { path: "^src/" },
      to: { path: "^(test|bench)/" },
    },
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.json" },
    enhancedResolveOptions: {
      exportsFields: ["exports"],
      conditionNames: ["import", "require", "node", "default", "types"],
      extensions: [".ts", ".mjs", ".js", ".json"],
    },
  },
};
