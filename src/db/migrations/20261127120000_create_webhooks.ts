import type { SchemaMigration } from "./schema-migration.js";

/**
 * The account's events (the outbox), its webhook endpoints, one delivery per
 * event and endpoint, and every attempt of a delivery. New tables only,
 * (the activity kinds are the code's list since the members' migration).
 *
 * An event and its deliveries are written by the statement that causes them
 * (a settle, a grant, a change of settings), so a crash leaves both or
 * neither. Endpoint secrets are kept as they are: signing needs them.
 */
export const createWebhooks: SchemaMigration = {
  name: "20261127120000_create_webhooks",
  transactional: true,
  async up(db) {
    await db.raw(`
      CREATE TABLE account_events (
        id bigserial PRIMARY KEY,
        account_id uuid NOT NULL REFERENCES accounts (id),
        -- The webhook-id: one per event, the same on every attempt and every endpoint.
        webhook_id text NOT NULL UNIQUE DEFAULT 'msg_' || replace(gen_random_uuid()::text, '-', ''),
        type text NOT NULL,
        data jsonb NOT NULL,
        at timestamptz NOT NULL DEFAULT clock_timestamp()
      );
      CREATE INDEX account_events_account ON account_events (account_id, id);

      CREATE TABLE webhook_endpoints (
        id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
        account_id uuid NOT NULL REFERENCES accounts (id),
        url text NOT NULL,
        secret text NOT NULL,
        -- After a rotation the old secret signs too, until this time.
        previous_secret text,
        previous_secret_until timestamptz,
        enabled boolean NOT NULL DEFAULT true,
        disabled_reason text NOT NULL DEFAULT '',
        created_at timestamptz NOT NULL DEFAULT now(),
        deleted_at timestamptz
      );
      CREATE INDEX webhook_endpoints_account ON webhook_endpoints (account_id) WHERE deleted_at IS NULL;

      CREATE TABLE webhook_deliveries (
        id bigserial PRIMARY KEY,
        event_id bigint NOT NULL REFERENCES account_events (id),
        endpoint_id uuid NOT NULL REFERENCES webhook_endpoints (id),
        state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
        attempts integer NOT NULL DEFAULT 0,
        -- Attempts made before the last replay: the retry schedule counts from here.
        replayed_after integer NOT NULL DEFAULT 0,
        next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        -- A replica holds a delivery while it sends it; another may take it only after this time.
        lease_until timestamptz,
        lease_token uuid,
        created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        finished_at timestamptz,
        UNIQUE (event_id, endpoint_id)
      );
      CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (endpoint_id, id) WHERE state = 'pending';
      CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';

      CREATE TABLE webhook_attempts (
        id bigserial PRIMARY KEY,
        delivery_id bigint NOT NULL REFERENCES webhook_deliveries (id),
        attempt integer NOT NULL,
        at timestamptz NOT NULL,
        -- NULL when no answer came (refused address, timeout, connection error).
        status integer,
        latency_ms integer NOT NULL,
        error text NOT NULL DEFAULT ''
      );
      CREATE INDEX webhook_attempts_delivery ON webhook_attempts (delivery_id, id);
      -- The activity kinds are checked by the code's list (src/team/activity.ts): the members' migration dropped the table's check.
    `);
  },
};
