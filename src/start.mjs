// `npm start`: builds dist/ when a source changed (build.mjs), then runs the
// server in this same process. npm execs it, so the pid npm started is the
// server's and its signals reach it; one Node process boots instead of two
// (a prestart step cost a whole Node start-up before the server's).
import { build } from "./build.mjs";

const status = build({ ifStale: true });
if (status !== 0) process.exit(status);
await import("../dist/bundle/main.mjs");
