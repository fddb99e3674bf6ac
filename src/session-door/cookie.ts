/**
 * The session cookie. HttpOnly (page scripts never see it), SameSite=Strict
 * (no other site's page makes the browser send it), Path=/. Over https it is
 * Secure and takes the `__Host-` prefix, which browsers only accept from a
 * secure origin with Path=/ and no Domain: no subdomain can plant or shadow it.
 */
export interface SessionCookie {
  name: string;
  secure: boolean;
}

/** The cookie's name and flags for a service reached at `publicUrl`. */
export function sessionCookieFor(publicUrl: string): SessionCookie {
  const secure = new URL(publicUrl).protocol === "https:";
  return { name: secure ? "__Host-typesafe_session" : "typesafe_session", secure };
}

/** The Set-Cookie value that gives the browser a session token, kept until the session's absolute expiry. */
export function setSessionCookie(cookie: SessionCookie, token: string, maxAgeMs: number): string {
  return `${cookie.name}=${token}; ${attributes(cookie)}; Max-Age=${Math.floor(maxAgeMs / 1000)}`;
}

/** The Set-Cookie value that makes the browser forget the session token. */
export function clearSessionCookie(cookie: SessionCookie): string {
  return `${cookie.name}=; ${attributes(cookie)}; Max-Age=0`;
}

/** The session token of a Cookie header, or undefined; a header naming it twice gives nothing (an ambiguous session is none). */
export function readSessionToken(cookie: SessionCookie, header: string | null | undefined): string | undefined {
  if (!header) return undefined;
  const values = header
    .split(";")
    .map((part) => part.trim())
    .filter((part) => part.startsWith(`${cookie.name}=`))
    .map((part) => part.slice(cookie.name.length + 1));
  return values.length === 1 && values[0] !== "" ? values[0] : undefined;
}

function attributes(cookie: SessionCookie): string {
  return `Path=/; HttpOnly; SameSite=Strict${cookie.secure ? "; Secure" : ""}`;
}
