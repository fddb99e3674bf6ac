/**
 * What the stand-alone runners (`npm run test:upgrade`, `npm run test:failover`)
 * share: a list of named checks printed at the end as `ok`/`FAIL` lines and
 * `N passed, M failed`, and a way to run `main` under a hard time limit so that
 * a hang is a failure and not a CI job that never ends.
 */

export interface Check {
  name: string;
  ok: boolean;
  detail?: string;
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
export const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;

export interface Checks {
  /** Records a check and returns whether it held, so a caller can go on or stop on it. */
  check(name: string, ok: boolean, detail?: string): boolean;
  readonly list: readonly Check[];
  /**
   * The report's lines: each check with its detail (a passing check's detail
   * only when shorter than `passingDetailLimit`), the time taken and the tally.
   */
  report(startedAt: number, passingDetailLimit?: number): string;
  /** 1 when a check failed or none ran, else 0. */
  exitCode(): number;
}

export function createChecks(now: () => number = Date.now): Checks {
  const list: Check[] = [];
  return {
    list,
    check(name, ok, detail) {
      list.push({ name, ok, detail });
      return ok;
    },
    report(startedAt, passingDetailLimit = Infinity) {
      const failed = list.filter((c) => !c.ok).length;
      const lines = list.map((c) => `${c.ok ? "ok  " : "FAIL"} ${c.name}${c.detail && (!c.ok || c.detail.length < passingDetailLimit) ? `: ${c.detail}` : ""}`);
      return `\n${lines.map((line) => `${line}\n`).join("")}took ${seconds(now() - startedAt)}\n${list.length - failed} passed, ${failed} failed\n`;
    },
    exitCode() {
      return list.length === 0 || list.some((c) => !c.ok) ? 1 : 0;
    },
  };
}

/**
 * Runs a runner's `main`: past `hardLimitMs` it calls `onHardLimit` (kill what
 * was started, remove the temporary folder) and exits 1; an error thrown out of
 * `main` counts as one failed check. The process exits shortly after `main`
 * ends, whatever handles are left open.
 */
export function runWithHardLimit(name: string, hardLimitMs: number, main: () => Promise<void>, onHardLimit: () => void): void {
  setTimeout(() => {
    onHardLimit();
    process.stdout.write(`${name}: did not finish within ${seconds(hardLimitMs)}\n0 passed, 1 failed\n`);
    process.exit(1);
  }, hardLimitMs).unref();
  main()
    .catch((err: unknown) => {
      process.stdout.write(`${name}: ${err instanceof Error ? err.message : String(err)}\n0 passed, 1 failed\n`);
      process.exitCode = 1;
    })
    .finally(() => setTimeout(() => process.exit(), 100).unref());
}
