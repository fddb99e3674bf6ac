import type { Knex } from "knex";
import type { SchemaMigration } from "./schema-migration.js";

/**
 * Members get a role, a second factor (TOTP) and one-time recovery codes;
 * an account may require the second factor; a password that passed but whose
 * second step is still due is a sign-in challenge.
 *
 * The role column's default is `member`, the least a member who can sign in
 * may do, so a row the previous release's CLI inserts during the upgrade gets
 * no power it did not name. The members already there have done everything
 * the account area offered: the oldest of each account (the first the
 * operator invited, preferring one who accepted) becomes its owner, and the
 * others keep exactly what they could do as members.
 *
 * The activity log's list of kinds leaves the database: the kinds grow with
 * each release, and the code's list (src/team/activity.ts) is the one guard.
 * The new tables name accounts without a foreign key, so no lock is taken on
 * the accounts table.
 */
export const addMemberRolesAndTwoFactor: SchemaMigration = {
  name: "20261127110000_add_member_roles_and_two_factor",
  transactional: true,
  async up(db) {
    await db.raw(`
      ALTER TABLE members
        ADD COLUMN role text NOT NULL DEFAULT 'member' CHECK (role IN ('owner', 'admin', 'member', 'viewer')),
        ADD COLUMN totp_secret text,
        ADD COLUMN totp_pending_secret text,
        ADD COLUMN totp_enabled_at timestamptz,
        ADD COLUMN totp_last_step bigint;

      UPDATE members m SET role = 'owner'
       WHERE m.removed_at IS NULL
         AND m.id = (SELECT x.id FROM members x
                      WHERE x.account_id = m.account_id AND x.removed_at IS NULL
                      ORDER BY (x.password_hash IS NULL), x.created_at, x.id
                      LIMIT 1);

      CREATE TABLE member_recovery_codes (
        id bigserial PRIMARY KEY,
        member_id uuid NOT NULL REFERENCES members (id),
        code_hash bytea NOT NULL,
        used_at timestamptz
      );
      CREATE INDEX member_recovery_codes_member ON member_recovery_codes (member_id) WHERE used_at IS NULL;

      CREATE TABLE sign_in_challenges (
        token_hash bytea PRIMARY KEY,
        member_id uuid NOT NULL REFERENCES members (id),
        created_at timestamptz NOT NULL,
        expires_at timestamptz NOT NULL,
        used_at timestamptz
      );
      CREATE INDEX sign_in_challenges_member ON sign_in_challenges (member_id) WHERE used_at IS NULL;

      CREATE TABLE account_settings (
        account_id uuid PRIMARY KEY,
        require_two_factor boolean NOT NULL DEFAULT false
      );

      ALTER TABLE account_activity DROP CONSTRAINT IF EXISTS account_activity_kind_check;
    `);
  },
};
