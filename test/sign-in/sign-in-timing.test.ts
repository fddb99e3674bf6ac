import { afterAll, beforeAll, expect, it } from "vitest";
import { SCRYPT_PARAMS } from "../../src/sign-in/passwords.js";
import { createTestAccount } from "../support/app.js";
import { createTestDatabase, type TestDatabase } from "../support/database.js";
import { accountClient, inviteMember, refusal, startAccountApp, uniqueEmail } from "../session-door/support.js";

/**
 * Sign-in answers an unknown email as slowly as a wrong password: both pay
 * the scrypt work, at the production cost. Its own file, kept out of the
 * mutation run (a few seconds of scrypt per run).
 */
let database: TestDatabase;
const PASSWORD = "a long enough password";

beforeAll(async () => {
  database = await createTestDatabase();
});
afterAll(async () => {
  await database?.close();
});

it("with the production password cost, an unknown email takes as long as a wrong password (within a factor of 3)", async () => {
  const real = await startAccountApp(database, {}, { scryptParams: SCRYPT_PARAMS });
  try {
    const { accountId } = await createTestAccount(database.db);
    const email = uniqueEmail("timed");
    const { token } = await inviteMember(database.db, accountId, email, real.clock.now());
    const { client } = accountClient(real.url);
    await client.acceptInvite({ inviteToken: token, password: PASSWORD });
    const timed = async (signInEmail: string) => {
      const started = performance.now();
      expect((await refusal(client.signIn({ email: signInEmail, password: "not the password" }))).reason).toBe("SIGN_IN_FAILED");
      return performance.now() - started;
    };
    await timed(uniqueEmail("warm-up"));
    const known: number[] = [];
    const unknown: number[] = [];
    for (let i = 0; i < 2; i++) {
      known.push(await timed(email));
      unknown.push(await timed(uniqueEmail("unknown")));
    }
    const ratio = Math.min(...unknown) / Math.min(...known);
    expect(ratio).toBeGreaterThan(1 / 3);
    expect(ratio).toBeLessThan(3);
  } finally {
    await real.stop();
  }
});

