/**
 * A DATABASE_URL read with libpq's meaning of a connection URI: the host part
 * may list several `host:port` pairs (IPv6 in brackets, every part
 * percent-encoded as the URI rules allow), and `target_session_attrs` says
 * which kind of node a connection must reach. The pg driver understands one
 * host only, so each node gets its own single-host URL, made of the same text
 * with only the host list replaced: pg reads everything else (user, password,
 * database, sslmode…) exactly as it reads a single-host URL. A URL naming one
 * host is handed to pg unchanged.
 */
export interface DatabaseTarget {
  /** The nodes in the order they are tried. */
  nodes: DatabaseNode[];
  /** `read-write`: only a node that accepts writes is used (the service's default); `any`: the first that answers. */
  targetSessionAttrs: TargetSessionAttrs;
}

export interface DatabaseNode {
  /** `host:port` as logs and metrics name the node (decoded; IPv6 in brackets; no credentials). */
  name: string;
  /** The single-host URL the pg driver is given for this node. */
  url: string;
  /**
   * With `sslmode=prefer` (libpq's default) or `allow`: the same URL with
   * `sslmode=disable`, tried when the server refuses TLS. libpq falls back
   * so; pg treats `prefer` as a demand for TLS (pg_auto_failover hands out
   * `sslmode=prefer` URIs for nodes made with `--no-ssl`).
   */
  plainUrl?: string;
}

export type TargetSessionAttrs = "read-write" | "any";

const TARGET_SESSION_ATTRS: readonly TargetSessionAttrs[] = ["read-write", "any"];

/** A DATABASE_URL that cannot be used; the message names the part at fault and never echoes a password. */
export class DatabaseUrlError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "DatabaseUrlError";
  }
}

/**
 * Splits `raw` into its nodes. Throws DatabaseUrlError for a malformed host
 * list, port or `target_session_attrs`; the rest of the URL is left to pg.
 */
export function parseDatabaseUrl(raw: string, defaultTargetSessionAttrs: TargetSessionAttrs = "read-write"): DatabaseTarget {
  const target = splitNodes(raw, defaultTargetSessionAttrs);
  return { ...target, nodes: target.nodes.map(withPlainFallback) };
}

function withPlainFallback(node: DatabaseNode): DatabaseNode {
  const sslmode = /[?&]sslmode=(prefer|allow)(?=&|#|$)/.exec(node.url);
  if (!sslmode) return node;
  const at = sslmode.index + sslmode[0].indexOf("=") + 1;
  return { ...node, plainUrl: `${node.url.slice(0, at)}disable${node.url.slice(at + sslmode[1]!.length)}` };
}

function splitNodes(raw: string, defaultTargetSessionAttrs: TargetSessionAttrs): DatabaseTarget {
  const scheme = /^(postgres(?:ql)?):\/\//i.exec(raw);
  if (!scheme) throw new DatabaseUrlError("not a postgres:// or postgresql:// URL");
  const afterScheme = raw.slice(scheme[0].length);
  const authorityEnd = firstIndexOf(afterScheme, ["/", "?", "#"]);
  const authority = afterScheme.slice(0, authorityEnd);
  const rest = afterScheme.slice(authorityEnd);
  const prefix = raw.slice(0, raw.length - rest.length);
  // libpq ends the credentials at the first "@" (a password holding "@" must write it %40).
  const at = authority.indexOf("@");
  const userinfo = at === -1 ? "" : authority.slice(0, at + 1);
  const hostList = authority.slice(at + 1);

  const query = splitQuery(rest);
  const targetSessionAttrs = readTargetSessionAttrs(query.params, defaultTargetSessionAttrs);
  const portParam = query.params.find(([key]) => key === "port")?.[1];
  const hostParam = query.params.some(([key]) => key === "host");

  const items = hostList.split(",");
  if (items.length === 1 && (hostList === "" || hostParam)) {
    // No host in the authority (a socket directory in ?host=, or pg's defaults): one node, as pg reads it.
    return { nodes: [{ name: hostList === "" ? "default" : hostList, url: withoutParams(raw, prefix, query, ["target_session_attrs"]) }], targetSessionAttrs };
  }
  if (hostParam) throw new DatabaseUrlError("names hosts both in the host list and in ?host=; use one of the two");
  const hosts = items.map((item, i) => parseHostItem(item, i, items.length));
  const ports = portParam === undefined ? [] : portParam.split(",").map((p, i, all) => parsePort(decode(p, "port"), `?port= item ${i + 1} of ${all.length}`));
  if (ports.length > 1 && ports.length !== hosts.length) {
    throw new DatabaseUrlError(`?port= lists ${ports.length} ports for ${hosts.length} hosts; give one port for all hosts or one per host`);
  }
  const multiHost = hosts.length > 1;
  if (!multiHost) {
    return { nodes: [{ name: nodeName(hosts[0]!.host, hosts[0]!.port ?? ports[0]), url: withoutParams(raw, prefix, query, ["target_session_attrs"]) }], targetSessionAttrs };
  }
  const base = `${scheme[1]}://${userinfo}`;
  const nodes = hosts.map(({ host, hostText, port }, i) => {
    const nodePort = port ?? ports[ports.length === 1 ? 0 : i];
    const url = base + hostText + (nodePort === undefined ? "" : `:${nodePort}`) + rebuild(query, ["target_session_attrs", "port"]);
    return { name: nodeName(host, nodePort), url };
  });
  return { nodes, targetSessionAttrs };
}

interface HostItem {
  /** Decoded host (IPv6 without its brackets). */
  host: string;
  /** The host as written in the URL, brackets and percent-encoding kept, for the node's own URL. */
  hostText: string;
  port: number | undefined;
}

function parseHostItem(item: string, index: number, count: number): HostItem {
  const where = count > 1 ? `host ${index + 1} of ${count} ("${item}")` : `host "${item}"`;
  if (item === "") throw new DatabaseUrlError(`${where}: is empty`);
  let hostText: string;
  let portText: string | undefined;
  if (item.startsWith("[")) {
    const close = item.indexOf("]");
    if (close === -1) throw new DatabaseUrlError(`${where}: an IPv6 address opened with "[" is not closed with "]"`);
    hostText = item.slice(0, close + 1);
    const after = item.slice(close + 1);
    if (after !== "" && !after.startsWith(":")) throw new DatabaseUrlError(`${where}: expected ":port" after "]"`);
    portText = after === "" ? undefined : after.slice(1);
    if (hostText === "[]") throw new DatabaseUrlError(`${where}: the IPv6 address is empty`);
  } else {
    const colons = item.split(":").length - 1;
    if (colons > 1) throw new DatabaseUrlError(`${where}: an IPv6 address must be written in brackets, as [::1]:5432`);
    const colon = item.indexOf(":");
    hostText = colon === -1 ? item : item.slice(0, colon);
    portText = colon === -1 ? undefined : item.slice(colon + 1);
    if (hostText === "") throw new DatabaseUrlError(`${where}: names a port but no host`);
  }
  const decoded = decode(hostText.startsWith("[") ? hostText.slice(1, -1) : hostText, where);
  if (/[\s/?#@,]/.test(hostText)) throw new DatabaseUrlError(`${where}: contains a character a host cannot hold`);
  return { host: decoded, hostText, port: portText === undefined ? undefined : parsePort(portText, where) };
}

function parsePort(text: string, where: string): number {
  if (!/^[0-9]{1,5}$/.test(text) || Number(text) < 1 || Number(text) > 65535) {
    throw new DatabaseUrlError(`${where}: the port must be a number from 1 to 65535, got "${text}"`);
  }
  return Number(text);
}

function decode(text: string, where: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    throw new DatabaseUrlError(`${where}: holds a malformed percent-encoding (a "%" must be followed by two hex digits)`);
  }
}

function readTargetSessionAttrs(params: [string, string][], fallback: TargetSessionAttrs): TargetSessionAttrs {
  const raw = params.find(([key]) => key === "target_session_attrs")?.[1];
  if (raw === undefined) return fallback;
  const value = safeDecode(raw);
  if (!(TARGET_SESSION_ATTRS as readonly string[]).includes(value)) {
    throw new DatabaseUrlError(`target_session_attrs: must be ${TARGET_SESSION_ATTRS.join(" or ")}, got "${value}"`);
  }
  return value as TargetSessionAttrs;
}

function safeDecode(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

function nodeName(host: string, port: number | undefined): string {
  const shown = host.includes(":") ? `[${host}]` : host;
  return `${shown}:${port ?? 5432}`;
}

interface SplitQuery {
  /** The path, as written, before "?" (it starts with "/" or is empty). */
  path: string;
  /** The parameters with their values as written (still encoded), keys decoded. */
  params: [string, string][];
  /** The raw "key=value" pieces, in order. */
  pieces: string[];
  fragment: string;
}

function splitQuery(rest: string): SplitQuery {
  const hash = rest.indexOf("#");
  const fragment = hash === -1 ? "" : rest.slice(hash);
  const beforeHash = hash === -1 ? rest : rest.slice(0, hash);
  const question = beforeHash.indexOf("?");
  const path = question === -1 ? beforeHash : beforeHash.slice(0, question);
  const pieces = question === -1 ? [] : beforeHash.slice(question + 1).split("&").filter((p) => p !== "");
  const params = pieces.map((piece): [string, string] => {
    const eq = piece.indexOf("=");
    return eq === -1 ? [safeDecode(piece), ""] : [safeDecode(piece.slice(0, eq)), piece.slice(eq + 1)];
  });
  return { path, params, pieces, fragment };
}

/** The path and the query without the parameters only this module reads, as written otherwise. */
function rebuild(query: SplitQuery, drop: string[]): string {
  const kept = query.pieces.filter((_, i) => !drop.includes(query.params[i]![0]));
  return query.path + (kept.length > 0 ? `?${kept.join("&")}` : "") + query.fragment;
}

/** The URL itself, unchanged unless it carries one of `drop` (pg would pass an unknown parameter on to the server). */
function withoutParams(raw: string, prefix: string, query: SplitQuery, drop: string[]): string {
  return query.params.some(([key]) => drop.includes(key)) ? prefix + rebuild(query, drop) : raw;
}

function firstIndexOf(text: string, needles: string[]): number {
  const found = needles.map((n) => text.indexOf(n)).filter((i) => i !== -1);
  return found.length === 0 ? text.length : Math.min(...found);
}
