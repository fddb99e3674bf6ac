import type { Knex } from "knex";
import type { SchemaMigration } from "./schema-migration.js";
import { markKeptKeys } from "./20261127130000_mark_kept_keys.js";
import * as createAccountsAndLedger from "./20261123000000_create_accounts_and_ledger.js";
import * as createMeteringFunctions from "./20261123000100_create_metering_functions.js";
import * as refuseAbandonedAdmissions from "./20261125000000_refuse_abandoned_admissions.js";
import * as meteringRulesAsDomains from "./20261125100000_metering_rules_as_domains.js";
import * as expireHoldsOnlyWhenDue from "./20261125110000_expire_holds_only_when_due.js";
import * as batchMeteringStatements from "./20261125120000_batch_metering_statements.js";
import * as recordAccountAfterResolve from "./20261126060000_record_account_after_resolve.js";
import * as createAccountArea from "./20261126000000_create_account_area.js";
import * as recordKeyOfEachCall from "./20261126000100_record_key_of_each_call.js";
import { addKeyLimits } from "./20261127100000_add_key_limits.js";
import { createMeteringFunctionsV2 } from "./20261127100100_create_metering_functions_v2.js";
import { addMemberRolesAndTwoFactor } from "./20261127110000_add_member_roles_and_two_factor.js";
import { createWebhooks } from "./20261127120000_create_webhooks.js";
import { recordBalanceAlerts } from "./20261127120100_record_balance_alerts.js";
import { narrowBalanceAlertTriggers } from "./20261127140500_narrow_balance_alert_triggers.js";
import { recordKeyEvents } from "./20261127141000_record_key_events.js";
import { indexExpiringKeys } from "./20261127141100_index_expiring_keys.js";
import { createUsageRollup } from "./20261127142000_create_usage_rollup.js";
import { indexRequestsByCreation } from "./20261127142100_index_requests_by_creation.js";
import { recordEvaluationOfEachCall } from "./20261128015900_record_evaluation_of_each_call.js";
import { createEvaluations } from "./20261128020000_create_evaluations.js";
import { indexRequestsByEvaluation } from "./20261128020100_index_requests_by_evaluation.js";
import { createCalibrations } from "./20261128040000_create_calibrations.js";

/**
 * The migrations applied and recorded by knex, in order; frozen. Listed statically so that they load the same way
 * under tsx, vitest and a compiled build, with no directory scanning.
 */
const migrations: Record<string, Knex.Migration> = {
  "20261123000000_create_accounts_and_ledger": createAccountsAndLedger,
  "20261123000100_create_metering_functions": createMeteringFunctions,
  "20261125000000_refuse_abandoned_admissions": refuseAbandonedAdmissions,
  "20261125100000_metering_rules_as_domains": meteringRulesAsDomains,
  "20261125110000_expire_holds_only_when_due": expireHoldsOnlyWhenDue,
  "20261125120000_batch_metering_statements": batchMeteringStatements,
  "20261126060000_record_account_after_resolve": recordAccountAfterResolve,
  "20261126000000_create_account_area": createAccountArea,
  "20261126000100_record_key_of_each_call": recordKeyOfEachCall,
};

/** The frozen knex migrations' names, in order of application. */
export const knexMigrationNames: readonly string[] = Object.keys(migrations);

export const migrationSource: Knex.MigrationSource<string> = {
  getMigrations: async () => [...knexMigrationNames],
  getMigrationName: (name) => name,
  getMigration: async (name) => {
    const migration = migrations[name];
    if (!migration) throw new Error(`unknown migration ${name}`);
    return migration;
  },
};

/**
 * The release-safe migrations, in order of application, after every migration
 * above. The list above is frozen: older releases check knex's table against
 * it at start, so nothing new is ever recorded there.
 */
export const schemaMigrations: readonly SchemaMigration[] = [
  addKeyLimits,
  createMeteringFunctionsV2,
  addMemberRolesAndTwoFactor,
  createWebhooks,
  recordBalanceAlerts,
  markKeptKeys,
  narrowBalanceAlertTriggers,
  recordKeyEvents,
  indexExpiringKeys,
  createUsageRollup,
  indexRequestsByCreation,
  recordEvaluationOfEachCall,
  createEvaluations,
  indexRequestsByEvaluation,
  createCalibrations,
];
