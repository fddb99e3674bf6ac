import type { Knex } from "knex";

/**
 * The account area's tables: the members who may sign in to an account, their
 * one-use invites and their sessions (tokens stored as SHA-256 only), the
 * sign-in attempts that throttle guessing, and the account's activity log.
 * API keys gain what the area shows (name, last 4 characters, who made them);
 * keys made before have no last 4 (empty) and were made by the operator.
 *
 * Requests gain the key they were admitted with, written by the admission
 * itself (next migration), so "last used" and usage by key cost the API's
 * calls no extra write. It has no foreign key: the key's row is already
 * looked up by the admission, and a foreign key would check it again on
 * every insert.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE TABLE members (
      id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
      account_id uuid NOT NULL REFERENCES accounts (id),
      email text NOT NULL CHECK (email = lower(email) AND email <> ''),
      password_hash text,
      created_at timestamptz NOT NULL DEFAULT now(),
      removed_at timestamptz
    );
    -- Sign-in names a member by email alone: one live member per email.
    CREATE UNIQUE INDEX members_live_email ON members (email) WHERE removed_at IS NULL;
    CREATE INDEX members_account ON members (account_id);

    CREATE TABLE member_invites (
      token_hash bytea PRIMARY KEY,
      member_id uuid NOT NULL REFERENCES members (id),
      created_at timestamptz NOT NULL,
      expires_at timestamptz NOT NULL,
      used_at timestamptz
    );
    CREATE INDEX member_invites_member ON member_invites (member_id);

    CREATE TABLE member_sessions (
      token_hash bytea PRIMARY KEY,
      member_id uuid NOT NULL REFERENCES members (id),
      created_at timestamptz NOT NULL,
      last_seen_at timestamptz NOT NULL,
      expires_at timestamptz NOT NULL,
      ended_at timestamptz
    );
    CREATE INDEX member_sessions_member ON member_sessions (member_id) WHERE ended_at IS NULL;

    CREATE TABLE sign_in_attempts (
      id bigserial PRIMARY KEY,
      email text NOT NULL,
      at timestamptz NOT NULL
    );
    CREATE INDEX sign_in_attempts_email_at ON sign_in_attempts (email, at);

    CREATE TABLE account_activity (
      id bigserial PRIMARY KEY,
      account_id uuid NOT NULL REFERENCES accounts (id),
      kind text NOT NULL CHECK (kind IN ('signed_in', 'sign_in_failed', 'signed_out', 'invite_accepted', 'key_created',
        'key_revoked', 'credits_granted', 'member_invited', 'member_removed')),
      actor text NOT NULL,
      detail text NOT NULL DEFAULT '',
      at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX account_activity_account_at ON account_activity (account_id, at, id);

    ALTER TABLE api_keys
      ADD COLUMN name text NOT NULL DEFAULT '',
      ADD COLUMN last4 text NOT NULL DEFAULT '',
      ADD COLUMN created_by text NOT NULL DEFAULT 'operator';

    ALTER TABLE requests ADD COLUMN key_id uuid;
    CREATE INDEX requests_key_created ON requests (key_id, created_at) WHERE key_id IS NOT NULL;
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`
    DROP INDEX requests_key_created;
    ALTER TABLE requests DROP COLUMN key_id;
    ALTER TABLE api_keys DROP COLUMN name, DROP COLUMN last4, DROP COLUMN created_by;
    DROP TABLE account_activity;
    DROP TABLE sign_in_attempts;
    DROP TABLE member_sessions;
    DROP TABLE member_invites;
    DROP TABLE members;
  `);
}
