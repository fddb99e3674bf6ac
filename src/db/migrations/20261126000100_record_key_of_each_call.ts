import type { Knex } from "knex";

/**
 * The admission writes the id of the API key a call was admitted with into
 * the call's request row: it looks the key up anyway, and the row is written
 * anyway, so the account area's "last used" and usage by key cost the API's
 * hot path nothing more.
 *
 * The function is edited where it stands rather than copied whole: each edit
 * replaces one exact piece of its current source and fails the migration if
 * that piece is not there, so a later rewrite of metering_admit cannot be
 * silently undone by this one. `down` makes the reverse edits.
 */
const EDITS: [before: string, after: string][] = [
  ["      v_account_id uuid;\n", "      v_account_id uuid;\n      v_key_id uuid;\n"],
  ["      SELECT k.account_id INTO v_account_id\n", "      SELECT k.account_id, k.id INTO v_account_id, v_key_id\n"],
  ["                                lease_expires_at, idempotency_key, request_hash)\n", "                                lease_expires_at, idempotency_key, request_hash, key_id)\n"],
  [
    "                  v_now + make_interval(secs => p_lease_ms / 1000.0), p_idempotency_key, p_request_hash)\n",
    "                  v_now + make_interval(secs => p_lease_ms / 1000.0), p_idempotency_key, p_request_hash, v_key_id)\n",
  ],
];

async function editAdmit(knex: Knex, edits: [string, string][]): Promise<void> {
  const found = await knex.raw(`SELECT pg_get_functiondef('metering_admit'::regproc) AS def`);
  let def = found.rows[0].def as string;
  for (const [before, after] of edits) {
    if (def.split(before).length !== 2) throw new Error(`metering_admit: expected exactly one ${JSON.stringify(before.trim())}`);
    def = def.replace(before, after);
  }
  await knex.raw(def.replaceAll("?", "\\?"));
}

export async function up(knex: Knex): Promise<void> {
  await editAdmit(knex, EDITS);
}

export async function down(knex: Knex): Promise<void> {
  await editAdmit(
    knex,
    EDITS.map(([before, after]) => [after, before]),
  );
}
