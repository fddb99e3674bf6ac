/**
 * What bench:sql and bench:triggers share: one script of statements run by a
 * PostgreSQL backend in single-user mode under valgrind's callgrind, and the
 * script of one-at-a-time admit + settle pairs as the service sends them.
 */
import crypto from "node:crypto";
import path from "node:path";
import { decisionReserveUnits } from "../src/metering/meter.js";
import { runAsClusterOwner } from "../test/support/private-cluster.js";

/** Instructions the backend executed for `script` on `database` of the stopped cluster in `clusterDir`. */
export function callgrindInstructions(bin: string, clusterDir: string, database: string, script: string): number {
  // valgrind reports on stderr: "==pid== Collected : <instructions>".
  const report = runAsClusterOwner(
    "valgrind",
    ["--tool=callgrind", "--callgrind-out-file=/dev/null", path.join(bin, "postgres"), "--single", "-D", clusterDir, "-c", "fsync=off", database],
    script,
  );
  // Single-user mode reports a failed statement and goes on: a count of errors would measure nothing.
  const failed = /ERROR: .*/.exec(report);
  if (failed) throw new Error(`a statement failed: ${failed[0]}`);
  const collected = /Collected : (\d+)/.exec(report);
  if (!collected) throw new Error(`callgrind printed no count:\n${report}`);
  return Number(collected[1]);
}

/**
 * `pairs` admit + settle pairs over the keys in turn, one statement a line
 * (single-user mode runs each line as its own transaction), after the
 * PREPAREs: the service names its hot-path statements, so PostgreSQL parses
 * each once per connection.
 */
export function meteredPairScript(texts: { admit: string; finish: string }, keyHashes: readonly string[], pairs: number): string {
  const lines = [`PREPARE admit AS ${texts.admit}`, `PREPARE finish AS ${texts.finish}`];
  const reserve = decisionReserveUnits(1);
  for (let i = 0; i < pairs; i++) {
    const id = `'${crypto.randomUUID()}'`;
    lines.push(
      `EXECUTE admit('\\x${keyHashes[i % keyHashes.length]}', 'decide', ${reserve}, false, 60000, NULL, NULL, NULL, ${id})`,
      `EXECUTE finish(${id}, true, 1000, NULL, NULL)`,
    );
  }
  return lines.join("\n") + "\n";
}
