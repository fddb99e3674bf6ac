import type { Knex } from "knex";

/**
 * Accounts, API keys, metered requests (each one a credit hold and a
 * concurrency lease) and the append-only ledger. CHECK constraints make an
 * overspend or a negative balance impossible even through a bug.
 */
export async function up(knex: Knex): Promise<void> {
  await knex.raw(`
    CREATE TABLE accounts (
      id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
      name text NOT NULL DEFAULT '',
      balance bigint NOT NULL DEFAULT 0 CHECK (balance >= 0),
      reserved bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0),
      free_remaining integer NOT NULL DEFAULT 0 CHECK (free_remaining >= 0),
      free_reserved integer NOT NULL DEFAULT 0 CHECK (free_reserved >= 0),
      in_flight integer NOT NULL DEFAULT 0 CHECK (in_flight >= 0),
      max_in_flight integer NOT NULL DEFAULT 5 CHECK (max_in_flight > 0),
      rate_limit integer NOT NULL DEFAULT 60 CHECK (rate_limit > 0),
      rate_window_ms integer NOT NULL DEFAULT 60000 CHECK (rate_window_ms > 0),
      recent timestamptz[] NOT NULL DEFAULT '{}',
      created_at timestamptz NOT NULL DEFAULT now(),
      CHECK (reserved <= balance),
      CHECK (free_reserved <= free_remaining),
      CHECK (in_flight <= max_in_flight)
    );

    CREATE TABLE api_keys (
      id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
      account_id uuid NOT NULL REFERENCES accounts (id),
      key_hash bytea NOT NULL UNIQUE,
      display_prefix text NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now(),
      revoked_at timestamptz
    );
    CREATE INDEX api_keys_account_id ON api_keys (account_id);

    CREATE TABLE requests (
      id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
      account_id uuid NOT NULL REFERENCES accounts (id),
      endpoint text NOT NULL CHECK (endpoint IN ('decide', 'search')),
      funding text NOT NULL CHECK (funding IN ('free', 'paid')),
      reserved bigint NOT NULL CHECK (reserved >= 0),
      charged bigint NOT NULL DEFAULT 0 CHECK (charged >= 0),
      status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'settled', 'released', 'expired')),
      created_at timestamptz NOT NULL,
      lease_expires_at timestamptz NOT NULL,
      resolved_at timestamptz,
      idempotency_key text,
      request_hash bytea,
      response jsonb,
      CHECK (charged <= reserved),
      CHECK (funding = 'paid' OR reserved = 0)
    );
    CREATE INDEX requests_active_lease ON requests (lease_expires_at) WHERE status = 'active';
    CREATE INDEX requests_active_account ON requests (account_id) WHERE status = 'active';
    CREATE INDEX requests_account_created ON requests (account_id, created_at);
    CREATE UNIQUE INDEX requests_idempotency ON requests (account_id, idempotency_key)
      WHERE idempotency_key IS NOT NULL AND status IN ('active', 'settled');

    CREATE TABLE ledger (
      id bigserial PRIMARY KEY,
      account_id uuid NOT NULL REFERENCES accounts (id),
      request_id uuid REFERENCES requests (id),
      kind text NOT NULL CHECK (kind IN ('grant', 'free_grant', 'hold', 'settle', 'release', 'expire')),
      amount bigint NOT NULL DEFAULT 0 CHECK (amount >= 0),
      free_units integer NOT NULL DEFAULT 0 CHECK (free_units >= 0),
      at timestamptz NOT NULL DEFAULT now(),
      CHECK ((kind IN ('grant', 'free_grant')) = (request_id IS NULL))
    );
    CREATE INDEX ledger_account_at ON ledger (account_id, at);
    -- A request has at most one hold and at most one terminal entry: it resolves at most once.
    CREATE UNIQUE INDEX ledger_request_once ON ledger (request_id, (kind = 'hold')) WHERE request_id IS NOT NULL;
  `);
}

export async function down(knex: Knex): Promise<void> {
  await knex.raw(`DROP TABLE ledger; DROP TABLE requests; DROP TABLE api_keys; DROP TABLE accounts;`);
}
