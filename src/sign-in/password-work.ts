import { apiError } from "../errors.js";

/** How much password hashing (scrypt) the service takes on at once. */
export interface PasswordWorkLimits {
  /** Hashes computed at the same time; each holds its memory (128 MiB with the default cost) meanwhile. */
  concurrent: number;
  /** Hashes waiting for a turn; past this, new ones are refused. */
  queued: number;
  /** Hashes one client (remote address) may have running or waiting. */
  perClient: number;
}

/** A bounded queue of password work, shared by every caller that hashes or verifies a password. */
export interface PasswordWork {
  /**
   * Runs `work` when a turn comes, or refuses at once with
   * PASSWORD_CHECKS_BUSY (429) and a retry delay when the queue is full or
   * this client already has its share in it. `onRefused` gets the delay in
   * seconds, for a Retry-After header.
   */
  run<T>(client: string, work: () => Promise<T>, onRefused?: (retryAfterSeconds: number) => void): Promise<T>;
  /** Work running and waiting now, and how many clients it belongs to (a client's entry goes when its work does). */
  readonly load: { running: number; waiting: number; clients: number };
}

/** What one hash is assumed to take before any was measured (scrypt at N = 2^17 on a small core). */
const FIRST_GUESS_MS = 300;

/**
 * Each scrypt costs a fixed amount of CPU and memory, and sign-in and
 * invite acceptance reach it without credentials: unbounded, a burst of them
 * slows every sign-in and grows the process's memory by the hash's size per
 * request. Work beyond `concurrent` waits in a short FIFO queue; beyond
 * that, and beyond a client's share, it is refused before any is done.
 * `now` is a monotonic clock in milliseconds, which times each hash for the
 * retry delay.
 */
export function createPasswordWork(limits: PasswordWorkLimits, now: () => number = () => performance.now()): PasswordWork {
  let running = 0;
  const waiting: Array<() => void> = [];
  const perClient = new Map<string, number>();
  let averageMs = FIRST_GUESS_MS;

  const retryAfterSeconds = () => Math.max(1, Math.ceil(((waiting.length + running) * averageMs) / limits.concurrent / 1000));

  const refuse = (why: string, onRefused?: (seconds: number) => void): never => {
    const seconds = retryAfterSeconds();
    onRefused?.(seconds);
    throw apiError("PASSWORD_CHECKS_BUSY", `${why}: try again in ${seconds} s`, { metadata: { retry_after_seconds: String(seconds) } });
  };

  return {
    get load() {
      return { running, waiting: waiting.length, clients: perClient.size };
    },
    async run(client, work, onRefused) {
      const mine = perClient.get(client) ?? 0;
      if (mine >= limits.perClient) refuse("too many password checks from this client at once", onRefused);
      if (running >= limits.concurrent && waiting.length >= limits.queued) refuse("too many password checks waiting", onRefused);
      perClient.set(client, mine + 1);
      try {
        if (running >= limits.concurrent) await new Promise<void>((resolve) => waiting.push(resolve));
        else running += 1;
        const started = now();
        try {
          return await work();
        } finally {
          averageMs = 0.8 * averageMs + 0.2 * (now() - started);
          // The turn passes straight to the next in line, so `running` never dips and lets a newcomer jump the queue.
          const next = waiting.shift();
          if (next) next();
          else running -= 1;
        }
      } finally {
        const left = (perClient.get(client) ?? 1) - 1;
        if (left === 0) perClient.delete(client);
        else perClient.set(client, left);
      }
    },
  };
}
