/**
 * How fast the embedded model works and how much work waits for it: the
 * prompt tokens it evaluates per second of busy time (recent evaluations
 * weigh most; evaluations side by side share the time they overlap), and the
 * tokens booked by calls admitted and not yet finished. Decide reads both to
 * give a call the time its tokens need, or to refuse it at once.
 */
export interface ModelPace {
  /** Marks an evaluation's start; the function it returns marks its end with the prompt tokens it evaluated. */
  evaluating(): (tokens: number) => void;
  /** Prompt tokens per second while busy; undefined before the first evaluation ended. */
  tokensPerSecond(): number | undefined;
  /** Books a call's tokens; the function it returns gives them back when the call ends. */
  book(tokens: number): () => void;
  queuedTokens(): number;
}

/** Each ended evaluation keeps this share of the weight of those before it. */
const KEEP = 0.8;

export function createModelPace(options: { now?: () => number } = {}): ModelPace {
  const now = options.now ?? (() => performance.now());
  let active = 0;
  let lastEvent = 0;
  /** Busy time since the last evaluation ended: that evaluation's share. */
  let busySinceEnd = 0;
  let tokens = 0;
  let busyMs = 0;
  let queued = 0;
  const tick = () => {
    const at = now();
    if (active > 0) busySinceEnd += at - lastEvent;
    lastEvent = at;
  };
  return {
    evaluating() {
      tick();
      active++;
      let ended = false;
      return (evaluated) => {
        if (ended) return;
        ended = true;
        tick();
        active--;
        tokens = tokens * KEEP + evaluated;
        busyMs = busyMs * KEEP + busySinceEnd;
        busySinceEnd = 0;
      };
    },
    tokensPerSecond: () => (busyMs > 0 && tokens > 0 ? (tokens / busyMs) * 1000 : undefined),
    book(count) {
      queued += count;
      let given = false;
      return () => {
        if (given) return;
        given = true;
        queued -= count;
      };
    },
    queuedTokens: () => queued,
  };
}
