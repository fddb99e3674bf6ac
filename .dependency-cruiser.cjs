/**
 * The import rules of src/, checked by `npm run lint:deps` (dependency-cruiser) in CI.
 *
 * The rooms, from the outside in:
 *   doors     gateway/, rpc/, session-door/, web/   take calls from the network
 *   http/                                what every door reads and writes: bodies, headers, the envelope, proto's HTTP bindings
 *   features  decision/, search/, webhooks/   the work a call asks for, and what an account hears of it
 *   metering/                            admit, settle and release money
 *   call/                                one call's context: request id, phases, the caller's API key, its log line
 *   keys/, team/, sign-in/, db/          API keys, members, sign-in, the store
 * A room may import the rooms below it, never one above. upstream/ talks to
 * the LLM upstream or runs the in-process model; it knows nothing of the
 * work it serves. The composition root (app.ts, main.ts, server.ts,
 * build.mjs) wires the doors; nothing else imports a door, and no door
 * imports another: what two doors share sits below them. openapi/ describes
 * the doors from what they share (proto's HTTP bindings, the request rules of
 * the features and rooms below), so it imports no door either. Shared
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
/** What the doors share of HTTP; below every door. */
const HTTP = "^src/http/";
/** The evaluation math: pure functions of numbers, run by the evaluation runner and on the decision path alike. */
const EVALUATION_MATH = "^src/evaluation/(metrics|calibration-fit|calibration-apply|seeded-random)\\.ts$";

/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: "no-circular",
      severity: "error",
      comment: "Modules that import each other cannot be read, tested or moved one at a time.",
      from: { path: "^src/" },
      to: { circular: true },
    },
    {
      name: "doors-only-from-the-root",
      severity: "error",
      comment: "Only the composition root wires the doors; features and everything below never reach up into them.",
      from: { path: "^src/", pathNot: [ROOT, DOORS] },
      to: { path: DOORS },
    },
    {
      name: "doors-apart",
      severity: "error",
      comment:
        "No door builds on another: what two doors share (the call's log line, the envelope, Node's headers) sits below them, " +
        "so a door can be read, changed or dropped alone.",
      from: { path: DOORS },
      to: { path: DOORS, pathNot: "^src/$1/" },
    },
    {
      name: "http-below-the-doors",
      severity: "error",
      comment: "http/ serves every door and the features' JSON rules; it knows nothing of money or of the call's owner.",
      from: { path: HTTP },
      to: { path: [METERING, STORE, UPSTREAM] },
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
      to: { path: [DOORS, HTTP, FEATURES, METERING, UPSTREAM] },
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
