import { describe, expect, it } from "vitest";
import { parseDatabaseUrl } from "../../src/db/connection-string.js";

/** Each node as "name -> url", the form a reader checks against libpq's rules. */
function nodesOf(raw: string): string[] {
  return parseDatabaseUrl(raw).nodes.map((n) => `${n.name} -> ${n.url}`);
}

describe("parseDatabaseUrl: libpq's multi-host connection URIs", () => {
  it.each([
    // One host: the URL is handed to pg as it is (only target_session_attrs, which pg does not know, is taken out).
    ["postgres://u:p@db:5432/app", ["db:5432 -> postgres://u:p@db:5432/app"]],
    ["postgresql://u@db/app?sslmode=require", ["db:5432 -> postgresql://u@db/app?sslmode=require"]],
    ["postgres://u@db:6000/app?target_session_attrs=any&sslmode=require", ["db:6000 -> postgres://u@db:6000/app?sslmode=require"]],
    // libpq: "postgresql://host1:port1,host2:port2,host3:port3/" — each host its own port.
    [
      "postgres://u:p@h1:5501,h2:5502,h3:5503/app?target_session_attrs=read-write",
      ["h1:5501 -> postgres://u:p@h1:5501/app", "h2:5502 -> postgres://u:p@h2:5502/app", "h3:5503 -> postgres://u:p@h3:5503/app"],
    ],
    // A host without a port gets the default port 5432.
    ["postgres://h1,h2:5433/app", ["h1:5432 -> postgres://h1/app", "h2:5433 -> postgres://h2:5433/app"]],
    // libpq: "if you specify only one port, it applies to all the hosts".
    ["postgres://h1,h2/app?port=6432", ["h1:6432 -> postgres://h1:6432/app", "h2:6432 -> postgres://h2:6432/app"]],
    // One port per host in ?port=, matched by position.
    ["postgres://h1,h2/app?port=6001,6002&sslmode=disable", ["h1:6001 -> postgres://h1:6001/app?sslmode=disable", "h2:6002 -> postgres://h2:6002/app?sslmode=disable"]],
    // IPv6 addresses in brackets, with and without a port.
    ["postgres://u@[::1]:5501,[2001:db8::7]/app", ["[::1]:5501 -> postgres://u@[::1]:5501/app", "[2001:db8::7]:5432 -> postgres://u@[2001:db8::7]/app"]],
    // Percent-encoding: credentials and hosts stay encoded in the node's URL (pg decodes them); names are decoded.
    [
      "postgres://app%40team:p%2Cw%40rd@db%2Done:5501,db-two:5502/my%20db",
      ["db-one:5501 -> postgres://app%40team:p%2Cw%40rd@db%2Done:5501/my%20db", "db-two:5502 -> postgres://app%40team:p%2Cw%40rd@db-two:5502/my%20db"],
    ],
    // No host in the authority: a socket directory in ?host=, read by pg as today.
    ["postgres://u@/app?host=/var/run/postgresql", ["default -> postgres://u@/app?host=/var/run/postgresql"]],
  ])("%s", (raw, nodes) => {
    expect(nodesOf(raw)).toEqual(nodes);
  });

  it.each([
    ["postgres://h1,h2/app", "read-write"],
    ["postgres://h1,h2/app?target_session_attrs=any", "any"],
    ["postgres://h1,h2/app?target_session_attrs=read-write", "read-write"],
    ["postgres://h1/app", "read-write"],
  ])("%s asks for a %s node", (raw, attrs) => {
    expect(parseDatabaseUrl(raw).targetSessionAttrs).toBe(attrs);
  });

  it("sslmode=prefer or allow gives each node a plain fallback, as libpq falls back when the server has no TLS", () => {
    const target = parseDatabaseUrl("postgres://h1:5501,h2:5502/app?target_session_attrs=read-write&sslmode=prefer");
    expect(target.nodes.map((n) => [n.url, n.plainUrl])).toEqual([
      ["postgres://h1:5501/app?sslmode=prefer", "postgres://h1:5501/app?sslmode=disable"],
      ["postgres://h2:5502/app?sslmode=prefer", "postgres://h2:5502/app?sslmode=disable"],
    ]);
    expect(parseDatabaseUrl("postgres://h1/app?sslmode=require").nodes[0]!.plainUrl).toBeUndefined();
    expect(parseDatabaseUrl("postgres://h1/app?sslmode=allow&x=1").nodes[0]!.plainUrl).toBe("postgres://h1/app?sslmode=disable&x=1");
  });

  it("the caller's default applies when the URL says nothing (the embedded store asks for any)", () => {
    expect(parseDatabaseUrl("postgres://127.0.0.1:40000/postgres", "any").targetSessionAttrs).toBe("any");
  });

  it.each([
    ["mysql://h1,h2/app", /not a postgres:\/\/ or postgresql:\/\/ URL/],
    ["postgres://u:s3cret@h1,,h3/app", /^host 2 of 3 \(""\): is empty$/],
    ["postgres://u:s3cret@h1:5432,h2:0/app", /^host 2 of 2 \("h2:0"\): the port must be a number from 1 to 65535, got "0"$/],
    ["postgres://u:s3cret@h1:5432,h2:70000/app", /^host 2 of 2 \("h2:70000"\): the port must be/],
    ["postgres://u:s3cret@h1:54x2,h2/app", /^host 1 of 2 \("h1:54x2"\): the port must be/],
    ["postgres://u:s3cret@h1,h2:/app", /^host 2 of 2 \("h2:"\): the port must be a number from 1 to 65535, got ""$/],
    ["postgres://u:s3cret@h1,::1:5432/app", /^host 2 of 2 \("::1:5432"\): an IPv6 address must be written in brackets/],
    ["postgres://u:s3cret@h1,[::1:5432/app", /^host 2 of 2 \("\[::1:5432"\): an IPv6 address opened with "\[" is not closed/],
    ["postgres://u:s3cret@h1,[::1]5432/app", /^host 2 of 2 \("\[::1\]5432"\): expected ":port" after "\]"/],
    ["postgres://u:s3cret@h1,[]:5432/app", /^host 2 of 2 \("\[\]:5432"\): the IPv6 address is empty/],
    ["postgres://u:s3cret@h1,:5432/app", /^host 2 of 2 \(":5432"\): names a port but no host/],
    ["postgres://u:s3cret@h1,db%zz/app", /^host 2 of 2 \("db%zz"\): holds a malformed percent-encoding/],
    ["postgres://u:s3cret@h1,h2,h3/app?port=1,2", /^\?port= lists 2 ports for 3 hosts/],
    ["postgres://u:s3cret@h1,h2/app?port=1,x", /^\?port= item 2 of 2: the port must be/],
    ["postgres://u:s3cret@h1,h2/app?host=/tmp", /names hosts both in the host list and in \?host=/],
    ["postgres://u:s3cret@h1,h2/app?target_session_attrs=prefer-standby", /^target_session_attrs: must be read-write or any, got "prefer-standby"$/],
  ])("refuses %s, naming the part at fault", (raw, message) => {
    let thrown: unknown;
    try {
      parseDatabaseUrl(raw);
    } catch (err) {
      thrown = err;
    }
    expect(thrown).toBeInstanceOf(Error);
    expect((thrown as Error).name).toBe("DatabaseUrlError");
    expect((thrown as Error).message).toMatch(message);
    expect((thrown as Error).message).not.toContain("s3cret");
  });
});
