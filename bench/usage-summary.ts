/**
 * Usage at the scale of a busy account: one account with a year of calls at
 * its rate limit (one a second: 31.5 million rows) in a scratch database.
 * Measures the usage roll-up's rate, GetUsageSummary per day for a year and
 * per hour for 31 days through the real AccountService over HTTP (Connect
 * JSON, signed in as a member), and the usage.csv export of a month through
 * its HTTP route. Baselines in the same run: the summary counted from every
 * call (the query summaries ran before the roll-up), and the export's pages
 * read bare with the same keyset query, without HTTP or CSV.
 *
 *   npm run bench:usage                               # local PostgreSQL (127.0.0.1:5432), a scratch database
 *   BENCH_USAGE_ROWS=1000000 npm run bench:usage      # a quick run: the same year, fewer calls
 *   DATABASE_URL=postgres://… npm run bench:usage
 *
 * The seed takes about 9 GB of disk at full size; the scratch database is
 * dropped at the end.
 */
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import knex, { type Knex } from "knex";
import { createApiKey } from "../src/keys/store.js";
import { createAccount } from "../src/admin/account-funding.js";
import { startApp } from "../src/app.js";
import { loadConfig } from "../src/config.js";
import { migrate } from "../src/db/database.js";
import { createLogger } from "../src/logger.js";
import { listFinishedCalls, summarizeCalls, summarizeCallsFromRequests, type SummaryRange } from "../src/metering/account-views.js";
import { rollClosedHours } from "../src/metering/usage-rollup.js";
import { accountClient, inviteMember, TEST_SCRYPT } from "../test/session-door/support.js";
import { createScratchDatabase, median } from "./support.js";

const ROWS = Number(process.env.BENCH_USAGE_ROWS ?? 365 * 86_400);
const SERVER_URL = process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
const CALLS = Number(process.env.BENCH_USAGE_CALLS ?? 50);
const BASELINE_CALLS = Number(process.env.BENCH_USAGE_BASELINE_CALLS ?? 3);
const DAY_MS = 86_400_000;
const YEAR_MS = 365 * DAY_MS;
const CHUNKS = 24;

const fixed = (value: number, digits = 0) => value.toFixed(digits);
const percentile = (values: number[], p: number) => [...values].sort((a, b) => a - b)[Math.min(values.length - 1, Math.ceil((p / 100) * values.length) - 1)]!;

/** Times `op` `count` times, one after another. */
async function timed(count: number, op: () => Promise<unknown>): Promise<{ p50: number; p99: number }> {
  const ms: number[] = [];
  for (let i = 0; i < count; i++) {
    const start = performance.now();
    await op();
    ms.push(performance.now() - start);
  }
  return { p50: median(ms), p99: percentile(ms, 99) };
}

/** Times each op `count` times, taking them in turn, so that the machine's noise falls on all alike. */
async function alternated<K extends string>(count: number, ops: Record<K, () => Promise<unknown>>): Promise<Record<K, { p50: number; p99: number }>> {
  const ms = Object.fromEntries(Object.keys(ops).map((k) => [k, [] as number[]])) as Record<K, number[]>;
  for (let i = 0; i < count; i++) {
    for (const [name, op] of Object.entries(ops) as [K, () => Promise<unknown>][]) {
      const start = performance.now();
      await op();
      ms[name].push(performance.now() - start);
    }
  }
  return Object.fromEntries(Object.entries(ms).map(([k, v]) => [k, { p50: median(v as number[]), p99: percentile(v as number[], 99) }])) as Record<K, { p50: number; p99: number }>;
}

async function seed(db: Knex, accountId: string, keyIds: [string, string], end: Date): Promise<void> {
  const stepMs = YEAR_MS / ROWS;
  const start = new Date(end.getTime() - YEAR_MS);
  const begun = performance.now();
  for (let chunk = 0; chunk < CHUNKS; chunk++) {
    const lo = Math.floor((chunk * ROWS) / CHUNKS);
    const hi = Math.floor(((chunk + 1) * ROWS) / CHUNKS);
    // One call each step; ids in order, so the seed appends to the primary key's index (real ids are random: a slower seed, the same reads).
    // A quarter are searches, a third use the second key, one in 50 was released.
    await db.raw(
      `INSERT INTO requests (id, account_id, endpoint, funding, reserved, charged, status, created_at, lease_expires_at, resolved_at, key_id)
       SELECT lpad(to_hex(i), 32, '0')::uuid, :account, CASE WHEN i % 4 = 0 THEN 'search' ELSE 'decide' END, 'paid', 1000,
              CASE WHEN i % 50 = 0 THEN 0 ELSE 250 END, CASE WHEN i % 50 = 0 THEN 'released' ELSE 'settled' END,
              t, t + interval '1 minute', t + interval '300 milliseconds', CASE WHEN i % 3 = 0 THEN :second::uuid ELSE :first::uuid END
         FROM generate_series(:lo::bigint, :hi::bigint - 1) AS i,
              LATERAL (SELECT :start::timestamptz + (i * :stepMs::float8) * interval '1 millisecond' AS t) AS times`,
      { account: accountId, first: keyIds[0], second: keyIds[1], lo, hi, start, stepMs },
    );
    const seconds = (performance.now() - begun) / 1000;
    process.stderr.write(`seeded ${hi.toLocaleString("en")} of ${ROWS.toLocaleString("en")} calls in ${fixed(seconds)} s\n`);
  }
  process.stderr.write("vacuum and analyze (as autovacuum would have by now)\n");
  await db.raw("VACUUM (ANALYZE) requests");
}

async function main(): Promise<void> {
  const scratch = await createScratchDatabase(SERVER_URL);
  // No statement timeout here: the baseline counts a year of calls in one query.
  const db = knex({ client: "pg", connection: scratch.url, pool: { min: 0, max: 4 } });
  try {
    await migrate(db, { useAdvisoryLock: true });
    const account = await createAccount(db, { name: "busy", units: 1e15, freeRequests: 0 });
    const first = await createApiKey(db, account.id, { name: "first" });
    const second = await createApiKey(db, account.id, { name: "second" });
    const end = new Date();
    await seed(db, account.id, [first.keyId, second.keyId], end);
    const tableGb = Number((await db.raw("SELECT pg_total_relation_size('requests') AS bytes")).rows[0].bytes) / 1e9;

    const rollStart = performance.now();
    const hours = await rollClosedHours(db, { now: () => new Date(), delayMs: 300_000 });
    const rollS = (performance.now() - rollStart) / 1000;
    const rolledRows = Number((await db.raw("SELECT coalesce(sum(calls), 0) AS n FROM usage_hourly")).rows[0].n);

    const config = loadConfig({
      PORT: "0",
      DATABASE_URL: scratch.url,
      TYPESAFE_LOG_LEVEL: "warn",
      TYPESAFE_SEARCH_SOURCES: "none",
      TYPESAFE_LLM_EMBEDDED: "off",
      // The bench rolls up itself, once, to time it.
      TYPESAFE_USAGE_ROLLUP_INTERVAL_MS: "3600000",
    });
    const app = await startApp(config, createLogger("warn", {}, () => {}), { scryptParams: TEST_SCRYPT });
    try {
      const { token } = await inviteMember(db, account.id, "bench@example.com", new Date());
      const { client, jar } = accountClient(app.server.url);
      await client.acceptInvite({ inviteToken: token, password: "a long enough password for the bench" });
      const cookie = `typesafe_session=${jar.cookies.get("typesafe_session")}`;

      const now = new Date();
      const year: SummaryRange = { since: new Date(now.getTime() - 365 * DAY_MS), until: now, granularity: "day" };
      const month: SummaryRange = { since: new Date(now.getTime() - 31 * DAY_MS), until: now, granularity: "hour" };
      const overHttp = (range: SummaryRange) => () =>
        client.getUsageSummary({ since: timestampFromDate(range.since), until: timestampFromDate(range.until), granularity: range.granularity });
      const check = await client.getUsageSummary({ since: timestampFromDate(year.since), until: timestampFromDate(year.until), granularity: "day" });
      const counted = check.buckets.reduce((sum, b) => sum + b.calls, 0);
      const reference = (await summarizeCallsFromRequests(db, account.id, year)).reduce((sum, b) => sum + b.calls, 0);
      if (counted !== reference) throw new Error(`the summary counted ${counted} calls, counting every call gives ${reference}`);

      await overHttp(year)(); // warm-up
      // GetAccount (one row read) is the floor of any account-area call: the session check, Connect and HTTP.
      // The summary's function alone, without them, shows what the roll-up's queries take.
      const figures = await alternated(CALLS, {
        dayHttp: overHttp(year),
        hourHttp: overHttp(month),
        floor: () => client.getAccount({}),
        dayQuery: () => summarizeCalls(db, account.id, year),
        hourQuery: () => summarizeCalls(db, account.id, month),
      });
      const { dayHttp, hourHttp, floor, dayQuery, hourQuery } = figures;
      const dayRaw = await timed(BASELINE_CALLS, () => summarizeCallsFromRequests(db, account.id, year));
      const hourRaw = await timed(BASELINE_CALLS, () => summarizeCallsFromRequests(db, account.id, month));

      // The export of the last 30 days through its route, then the same pages read bare.
      const since = new Date(now.getTime() - 30 * DAY_MS);
      const csvStart = performance.now();
      const response = await fetch(`${app.server.url}/account/v1/usage.csv?since=${since.toISOString()}&until=${now.toISOString()}`, { headers: { cookie } });
      let lines = 0;
      const decoder = new TextDecoder();
      for await (const chunk of response.body!) lines += (decoder.decode(chunk, { stream: true }).match(/\r\n/g) ?? []).length;
      const csvS = (performance.now() - csvStart) / 1000;
      const csvRows = lines - 1;
      const bareStart = performance.now();
      let bareRows = 0;
      let after: { startedAt: Date; requestId: string } | undefined;
      for (;;) {
        const { calls, more } = await listFinishedCalls(db, account.id, { since, until: now }, { size: 1_000, after });
        bareRows += calls.length;
        const last = calls.at(-1);
        if (!more || !last) break;
        after = { startedAt: last.startedAt, requestId: last.requestId };
      }
      const bareS = (performance.now() - bareStart) / 1000;
      if (bareRows !== csvRows) throw new Error(`usage.csv held ${csvRows} rows, the bare pages ${bareRows}`);

      const ms = (f: { p50: number; p99: number }) => `p50 ${fixed(f.p50, 1)} ms, p99 ${fixed(f.p99, 1)} ms`;
      console.log(`${ROWS.toLocaleString("en")} calls over a year in one account (requests: ${fixed(tableGb, 1)} GB)`);
      console.log(`roll-up: ${hours} hours, ${rolledRows.toLocaleString("en")} calls in ${fixed(rollS, 1)} s (${fixed(hours / rollS)} hours/s, ${fixed(rolledRows / rollS)} calls/s)`);
      console.log("| measure | figure | baseline (counting every call) | ratio | target |");
      console.log("| --- | --- | --- | --- | --- |");
      console.log(`| GetUsageSummary per day, 365 days (HTTP, ${CALLS} calls) | ${ms(dayHttp)} | ${ms(dayRaw)} | ${fixed(dayRaw.p50 / dayHttp.p50)}× faster | ≤ 50 ms |`);
      console.log(`| GetUsageSummary per hour, 31 days (HTTP, ${CALLS} calls) | ${ms(hourHttp)} | ${ms(hourRaw)} | ${fixed(hourRaw.p50 / hourHttp.p50)}× faster | ≤ 50 ms |`);
      console.log(`| the summary's queries alone, per day, 365 days | ${ms(dayQuery)} | ${ms(dayRaw)} | ${fixed(dayRaw.p50 / dayQuery.p50)}× faster | — |`);
      console.log(`| the summary's queries alone, per hour, 31 days | ${ms(hourQuery)} | ${ms(hourRaw)} | ${fixed(hourRaw.p50 / hourQuery.p50)}× faster | — |`);
      console.log(`| GetAccount (HTTP): the floor of an account-area call | ${ms(floor)} | — | — | — |`);
      console.log(
        `| usage.csv, 30 days (HTTP) | ${csvRows.toLocaleString("en")} rows in ${fixed(csvS, 1)} s: ${fixed(csvRows / csvS)} rows/s | bare keyset pages: ${fixed(bareRows / bareS)} rows/s | ${((csvRows / csvS) / (bareRows / bareS)).toFixed(2)}× | every row |`,
      );
    } finally {
      await app.stop();
    }
  } finally {
    await db.destroy();
    if (process.env.BENCH_USAGE_KEEP === "1") process.stderr.write(`kept ${scratch.url}\n`);
    else await scratch.drop();
  }
}

await main();
