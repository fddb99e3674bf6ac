/** A signal bound to its parents and an optional timeout; dispose() detaches it once the work is done. */
export interface LinkedSignal {
  signal: AbortSignal;
  /** True when the abort came from this link's own timeout rather than a parent. */
  timedOut(): boolean;
  dispose(): void;
}

/**
 * Aborts when any parent aborts or after timeoutMs. Unlike AbortSignal.any and
 * AbortSignal.timeout, it removes its listeners and clears its timer on
 * dispose(): metering, every upstream attempt and every search source make
 * one per call, and on Node 20 the built-ins leave that cleanup to the
 * garbage collector (measurable under load).
 */
export function linkedSignal(parents: readonly AbortSignal[], timeoutMs?: number): LinkedSignal {
  const controller = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  let byTimeout = false;
  const onAbort = (event: Event) => {
    dispose();
    controller.abort((event.target as AbortSignal).reason);
  };
  const dispose = () => {
    if (timer !== undefined) clearTimeout(timer);
    timer = undefined;
    for (const parent of parents) parent.removeEventListener("abort", onAbort);
  };
  const aborted = parents.find((p) => p.aborted);
  if (aborted) {
    controller.abort(aborted.reason);
    return { signal: controller.signal, timedOut: () => false, dispose: () => {} };
  }
  for (const parent of parents) parent.addEventListener("abort", onAbort, { once: true });
  if (timeoutMs !== undefined) {
    timer = setTimeout(() => {
      byTimeout = true;
      dispose();
      controller.abort(new DOMException(`timed out after ${timeoutMs} ms`, "TimeoutError"));
    }, timeoutMs);
    timer.unref();
  }
  return { signal: controller.signal, timedOut: () => byTimeout, dispose };
}
