import { createContextKey, type HandlerContext, type Interceptor } from "@connectrpc/connect";
import type { Knex } from "knex";
import { resumeSession, SESSIONLESS_METHODS, type SessionMember, type SessionPolicy } from "../sign-in/sessions.js";
import { apiError } from "../errors.js";
import { AccountService } from "../gen/typesafe/account/v1/account_service_pb.js";
import { readSessionToken, type SessionCookie } from "./cookie.js";
import { isCrossSite } from "./origin.js";

/** The signed-in member of an account-area call, set by the door; undefined on the calls that need no session. */
export const kMember = createContextKey<SessionMember | undefined>(undefined);
/** The session token the call's cookie carried, if any (sign-in and sign-out end it). */
export const kSessionToken = createContextKey<string | undefined>(undefined);

export interface AccountDoorOptions {
  db: Knex;
  cookie: SessionCookie;
  policy: SessionPolicy;
  /** The origins whose pages may call: the public URL's (isCrossSite). */
  allowedOrigins: ReadonlySet<string>;
  now: () => Date;
}

/**
 * The account area's door, as the API key check is the API's: every call of
 * AccountService passes here first. A call from another site's page is
 * refused (CROSS_SITE_REFUSED); then the session cookie is resumed into the
 * member the call acts for (SIGNED_OUT without one). An API key is no
 * session: `Authorization` is never read here. The answer is never cached.
 */
export async function openAccountDoor(
  options: AccountDoorOptions,
  call: { methodName: string; header: Headers; values: HandlerContext["values"] },
): Promise<void> {
  if (isCrossSite(call.header, options.allowedOrigins)) {
    throw apiError("CROSS_SITE_REFUSED", "origin: calls to the account area must come from its own pages", {
      field: "origin",
      rule: "the service's own origin",
    });
  }
  const token = readSessionToken(options.cookie, call.header.get("cookie"));
  call.values.set(kSessionToken, token);
  if (SESSIONLESS_METHODS.has(call.methodName)) return;
  const member = token === undefined ? undefined : await resumeSession(options.db, token, options.policy, options.now());
  if (!member) throw apiError("SIGNED_OUT", "not signed in, or the session ended: sign in to the account area");
  call.values.set(kMember, member);
}

/** The door as a Connect interceptor, for Connect, gRPC-Web and gRPC calls of AccountService; other services pass through. */
export function createAccountDoorInterceptor(options: AccountDoorOptions): Interceptor {
  return (next) => async (req) => {
    if (req.service.typeName !== AccountService.typeName) return next(req);
    await openAccountDoor(options, { methodName: req.method.name, header: req.header, values: req.contextValues });
    const res = await next(req);
    res.header.set("cache-control", "no-store");
    return res;
  };
}

/**
 * The door as a gateway route's, for AccountService's JSON paths: the same
 * checks as the interceptor, on the gateway's handler context (whose
 * envelope is never cached, refusals included).
 */
export function accountRouteDoor(options: AccountDoorOptions): (ctx: HandlerContext) => Promise<void> {
  return async (ctx) => {
    await openAccountDoor(options, { methodName: ctx.method.name, header: ctx.requestHeader, values: ctx.values });
  };
}

/** The member a call acts for; the door has set it on every call that needs one. */
export function memberOf(ctx: HandlerContext): SessionMember {
  const member = ctx.values.get(kMember);
  if (!member) throw apiError("SIGNED_OUT", "not signed in, or the session ended: sign in to the account area");
  return member;
}
