import { createContextKey, type HandlerContext } from "@connectrpc/connect";

/**
 * Where one call's time went, in milliseconds: admission by the meter, the
 * work itself (upstream LLM or search providers), and the finish (a settle
 * or a release; the log field and the Server-Timing entry keep their first
 * name, `settle`).
 * meteredRpc fills it; the call log line and the gateway's Server-Timing
 * header read it. Phases a call never reached stay undefined.
 */
export interface CallPhases {
  admitMs?: number;
  upstreamMs?: number;
  finishMs?: number;
  /**
   * What the work itself reports for the call's log line (a decision: its
   * prompt version, questions and tokens), so that a call logs one line,
   * not one per layer.
   */
  details?: Record<string, string | number>;
}

export const kCallPhases = createContextKey<CallPhases | undefined>(undefined, { description: "call phases" });

/** The call's phase record, created on first use. */
export function callPhasesOf(ctx: HandlerContext): CallPhases {
  let phases = ctx.values.get(kCallPhases);
  if (!phases) {
    phases = {};
    ctx.values.set(kCallPhases, phases);
  }
  return phases;
}

const round = (ms: number) => Math.round(ms * 10) / 10;

/** The phases as log fields (`admit_ms`, `upstream_ms`, `settle_ms` for the finish), only those reached, then the work's details. */
export function phaseLogFields(phases: CallPhases | undefined): Record<string, string | number> {
  const fields: Record<string, string | number> = {};
  if (phases?.admitMs !== undefined) fields["admit_ms"] = round(phases.admitMs);
  if (phases?.upstreamMs !== undefined) fields["upstream_ms"] = round(phases.upstreamMs);
  if (phases?.finishMs !== undefined) fields["settle_ms"] = round(phases.finishMs);
  return phases?.details ? Object.assign(fields, phases.details) : fields;
}

/** A Server-Timing value (W3C Server Timing): the phases reached, then `total`. */
export function serverTimingHeader(phases: CallPhases | undefined, totalMs: number): string {
  const entries: string[] = [];
  if (phases?.admitMs !== undefined) entries.push(`admit;dur=${round(phases.admitMs)}`);
  if (phases?.upstreamMs !== undefined) entries.push(`upstream;dur=${round(phases.upstreamMs)}`);
  if (phases?.finishMs !== undefined) entries.push(`settle;dur=${round(phases.finishMs)}`);
  entries.push(`total;dur=${round(totalMs)}`);
  return entries.join(", ");
}
