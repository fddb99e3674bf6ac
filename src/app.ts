import { setMaxListeners } from "node:events";
import { getHeapStatistics } from "node:v8";
import type { ConnectRouter } from "@connectrpc/connect";
import type { Config } from "./config.js";
import { openDatabase, type Database } from "./db/database.js";
import { reachesWritableNode } from "./db/primary-client.js";
import { chooseDecisionEngines, type DecisionEngines } from "./decision/engine-choice.js";
import { createDecisionService } from "./decision/service.js";
import { createEvaluationRunner, type EvaluationRunner } from "./evaluation/runner.js";
import { createGateway, type DecisionsStatus } from "./gateway/gateway.js";
import type { ModelPace } from "./upstream/model-pace.js";
import { retryAfterSeconds, type SupervisorClock } from "./upstream/embedded-supervisor.js";
import { prepareStatementsOn } from "./metering/ledger.js";
import { createMeter, type Meter } from "./metering/meter.js";
import { createSweeper } from "./metering/sweeper.js";
import { rollClosedHours } from "./metering/usage-rollup.js";
import { createMetrics } from "./metrics.js";
import { apiRoutes, served } from "./gateway/routes.js";
import { readOpenApiDocument } from "./openapi/served.js";
import { DecisionService } from "./gen/typesafe/decision/v1/decision_service_pb.js";
import { SearchService } from "./gen/typesafe/search/v1/search_service_pb.js";
import type { Logger } from "./logger.js";
import { file_typesafe_error_v1_error } from "./gen/typesafe/error/v1/error_pb.js";
import { file_google_rpc_error_details } from "./gen/google/rpc/error_details_pb.js";
import { registerHealth } from "./rpc/health.js";
import { createObserveInterceptor } from "./call/observe.js";
import { registerReflection } from "./rpc/reflection.js";
import { createSearchService } from "./search/service.js";
import { startServer, type RunningServer } from "./server.js";
import { createAccountService } from "./session-door/service.js";
import { sessionCookieFor } from "./session-door/cookie.js";
import { listeningOrigins } from "./session-door/origin.js";
import { answerHeadersFor } from "./session-door/answer-headers.js";
import { accountRouteDoor, createAccountDoorInterceptor, type AccountDoorOptions } from "./session-door/door.js";
import { createUsageCsvHandler, USAGE_CSV_PATH } from "./session-door/usage-csv.js";
import { createEvaluationResultsCsvHandler, EVALUATION_RESULTS_CSV_PATH } from "./session-door/evaluation-results-csv.js";
import { createEvaluationUploadHandler, EVALUATION_UPLOAD_PATH } from "./session-door/evaluation-upload.js";
import { countLiveSessions } from "./sign-in/sessions.js";
import { createPasswordWork } from "./sign-in/password-work.js";
import type { ScryptParams } from "./sign-in/passwords.js";
import { AccountService } from "./gen/typesafe/account/v1/account_service_pb.js";
import { withAccountPage } from "./web/account-page.js";
import { createDeliverer, type Deliverer } from "./webhooks/deliverer.js";
import { createResolver } from "./webhooks/sender.js";
import { createKeyExpiryWatch } from "./webhooks/key-expiry.js";

export interface App {
  server: RunningServer;
  database: Database;
  meter: Meter;
  deliverer: Deliverer;
  evaluationRunner: EvaluationRunner;
  /** Graceful stop: drain in-flight calls within the grace period, then close the store. */
  stop(): Promise<void>;
}

/** What tests may put in place of the real thing: the account area's clock and password cost. */
export interface AppOverrides {
  now?: () => Date;
  scryptParams?: ScryptParams;
  /** Called with each address a webhook is about to connect to; tests refuse all but loopback there. */
  webhookBeforeConnect?: (address: string) => void;
  /** The clock of the embedded model's waits between download tries. */
  modelClock?: SupervisorClock;
  /** The embedded model's pace, so a test can give it a measured rate. */
  modelPace?: ModelPace;
}

/**
 * The composition root: builds every dependency once, registers the services
 * on one router for gRPC/Connect/gRPC-Web and on the JSON gateway, and
 * listens. Nothing here runs on import.
 */
export async function startApp(config: Config, logger: Logger, overrides: AppOverrides = {}): Promise<App> {
  const database = await openDatabase({
    databaseUrl: config.databaseUrl,
    dataDir: config.dataDir,
    poolMax: config.dbPoolMax,
    logger,
  });
  const { db } = database;
  await prepareStatementsOn(db);
  const meter = createMeter({ db, config: config.metering, logger });
  const now = overrides.now ?? (() => new Date());
  const deliverer = createDeliverer({
    db,
    config: config.webhooks,
    logger,
    resolve: createResolver(config.webhooks.dnsServers),
    leaseMarginMs: config.metering.leaseMarginMs,
    beforeConnect: overrides.webhookBeforeConnect,
  });
  // Summaries read closed hours from the roll-up; its clock is the wall clock, never a test's account-area clock.
  const rollupTiming = { now: () => new Date(), delayMs: config.metering.rollupDelayMs };
  const usageRollup = createSweeper((signal) => rollClosedHours(db, rollupTiming, signal), config.metering.rollupIntervalMs, logger, "usage roll-up");
  const keyExpiryWatch = createKeyExpiryWatch({
    db,
    intervalMs: config.webhooks.keyExpiryCheckMs,
    now,
    logger,
    onRecorded: () => deliverer.wake(),
  });
  const sessionPolicy = { idleMs: config.account.sessionIdleMs, absoluteMs: config.account.sessionAbsoluteMs };
  const metrics = config.metrics ? createMetrics({ meter, db, liveSessions: () => countLiveSessions(db, sessionPolicy, now()), embeddedTokensEvaluated: () => (engines.kind === "embedded" ? engines.host.model()?.tokensEvaluated() : undefined) }) : undefined;
  // The upstream, or the model in this process (fetched and loaded while the service already serves), or none.
  const engines = chooseDecisionEngines({ llm: config.llm, dataDir: config.dataDir, logger, metrics, embedded: { clock: overrides.modelClock, pace: overrides.modelPace } });
  const decision = createDecisionService({ db, meter, llm: config.llm, metrics, engines });
  const evaluationRunner = createEvaluationRunner({
    db,
    engines,
    config: config.evaluations,
    requestTimeoutMs: config.llm.requestTimeoutMs,
    llm: config.llm,
    leaseMarginMs: config.metering.leaseMarginMs,
    now,
    logger,
  });
  const search = createSearchService({ db, meter, config: config.search, logger, metrics });

  const observer = { logger, metrics };
  const sessionCookie = sessionCookieFor(config.account.publicUrl);
  // Without a configured public URL, the listening address's origins join once the port is bound.
  const allowedOrigins = new Set([new URL(config.account.publicUrl).origin]);
  const accountDoor: AccountDoorOptions = { db, cookie: sessionCookie, policy: sessionPolicy, allowedOrigins, now };
  const account = createAccountService({
    db,
    cookie: sessionCookie,
    policy: sessionPolicy,
    now,
    metrics,
    scryptParams: overrides.scryptParams,
    passwordWork: createPasswordWork(config.account.passwordWork),
    maxKeysPerAccount: config.account.maxKeysPerAccount,
    publicUrl: config.account.publicUrl,
    webhooks: { allowLoopback: config.webhooks.allowLoopback, wake: () => deliverer.wake() },
    wakeEvaluationRunner: () => evaluationRunner.wake(),
  });
  const usageCsv = createUsageCsvHandler({ db, door: accountDoor, observer });
  const evaluationResultsCsv = createEvaluationResultsCsvHandler({ db, door: accountDoor, observer });
  const evaluationUpload = createEvaluationUploadHandler({ db, door: accountDoor, observer, maxBodyBytes: config.maxBodyBytes, wakeRunner: () => evaluationRunner.wake() });
  // The account area's plain HTTP routes, beside its RPCs' JSON paths.
  const accountRoutes = new Map([
    [USAGE_CSV_PATH, usageCsv],
    [EVALUATION_RESULTS_CSV_PATH, evaluationResultsCsv],
    [EVALUATION_UPLOAD_PATH, evaluationUpload],
  ]);

  // Ready only while a node accepts writes: during a failover, a standby that still answers is not enough.
  const isReady = () => reachesWritableNode(db);
  const routes = (router: ConnectRouter) => {
    registerReflection(router, [file_typesafe_error_v1_error, file_google_rpc_error_details]);
    router.service(DecisionService, decision);
    router.service(SearchService, search);
    router.service(AccountService, account);
    registerHealth(router, isReady);
  };
  // The metered services' JSON paths need an API key; the account area's, the session cookie (and never a key).
  const keyedServices = [served(DecisionService, decision), served(SearchService, search)];
  const accountArea = served(AccountService, account, accountRouteDoor(accountDoor));
  const shutdown = new AbortController();
  // Every call in flight listens for the end of a shutdown's grace period.
  setMaxListeners(0, shutdown.signal);
  const gateway = createGateway({
    routes: apiRoutes([...keyedServices, accountArea]),
    logger,
    maxBodyBytes: config.maxBodyBytes,
    isReady,
    shutdownSignal: shutdown.signal,
    metrics,
    openApiDocument: readOpenApiDocument(),
    decisionsStatus: () => decisionsStatus(engines),
  });
  let server: RunningServer;
  try {
    server = await startServer(
      {
        routes,
        fallback: withAccountPage((req, res) => (accountRoutes.get((req.url ?? "").split("?", 1)[0]!) ?? gateway)(req, res)),
        // The account door runs inside the observer, so its refusals are logged and typed like any error.
        interceptors: [createObserveInterceptor(observer), createAccountDoorInterceptor(accountDoor)],
        maxBodyBytes: config.maxBodyBytes,
        keyedServices: new Set(keyedServices.map(({ service }) => service.typeName)),
        grpcShortPath: config.grpcShortPath,
        answerHeaders: answerHeadersFor,
        logger,
        shutdown,
        connections: config.connections,
        metrics,
      },
      config.host,
      config.port,
    );
  } catch (err) {
    await engines.stop();
    await database.close();
    throw err;
  }
  if (!config.account.publicUrlConfigured) for (const origin of listeningOrigins(config.host, server.port)) allowedOrigins.add(origin);
  meter.startSweeper();
  usageRollup.start();
  deliverer.start();
  keyExpiryWatch.start();
  evaluationRunner.start();
  // The JavaScript heap's ceiling (npm start sets it; see docs/performance.md), so an operator sees what the process runs with.
  logger.info("listening", { url: server.url, database: database.kind, heap_limit_mb: Math.round(getHeapStatistics().heap_size_limit / 1_048_576) });
  logger.info("enabled", enabledSummary(config));
  // A development setting left on in production would let webhooks reach this machine's own services.
  if (config.webhooks.allowLoopback) {
    logger.warn("webhooks may reach loopback", { setting: "TYPESAFE_WEBHOOK_ALLOW_LOOPBACK=on", use: "local development only" });
  }

  return {
    server,
    database,
    meter,
    deliverer,
    evaluationRunner,
    async stop() {
      logger.info("shutting down", { grace_ms: config.shutdownGraceMs });
      meter.beginShutdown();
      // A webhook in flight is abandoned and its lease given back: another replica sends it with the same webhook-id.
      await Promise.all([server.close(config.shutdownGraceMs), deliverer.stop(), keyExpiryWatch.stop(), usageRollup.stop(), evaluationRunner.stop()]);
      // Calls cut off by the grace period give their holds back now, not at lease expiry.
      await meter.releaseAll();
      await meter.stop();
      await engines.stop();
      await database.close();
      logger.info("stopped");
    },
  };
}

function decisionsStatus(engines: DecisionEngines): DecisionsStatus {
  if (engines.kind !== "embedded") return { engine: engines.kind };
  const status = engines.host.status();
  return {
    engine: "embedded",
    model_state: status.state,
    ...(status.state === "fetching" ? { percent: status.percent } : {}),
    ...(status.state === "failed" && status.nextTryInMs !== undefined ? { next_try_in_seconds: retryAfterSeconds(status) } : {}),
  };
}

/** What this deployment serves, in one start-up line an operator can read at a glance. */
export function enabledSummary(config: Config): { decisions: string; search: string } {
  const upstream = config.llm.baseUrl === undefined ? undefined : new URL(config.llm.baseUrl);
  const sources = config.search.configuredSources ?? [];
  return {
    decisions: upstream
      ? `on: ${upstream.host}, model ${config.llm.model}`
      : config.llm.embedded.enabled
        ? `embedded: ${config.llm.embedded.modelPath ? "a local model file (TYPESAFE_LLM_MODEL_PATH)" : `${config.llm.embedded.modelFileName}, fetched into the data folder on first start`}`
        : "off: set TYPESAFE_LLM_BASE_URL (the embedded model is off)",
    search: sources.length > 0 ? `on: ${sources.join(", ")}` : "off: no source configured (TYPESAFE_SEARCH_SOURCES)",
  };
}
