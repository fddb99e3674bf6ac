import net from "node:net";

/**
 * Which addresses a webhook may be sent to: public unicast only. Everything
 * a server's own network can reach but the public cannot is refused (loopback,
 * private, carrier-grade NAT, link-local with the cloud metadata services,
 * multicast, reserved), and so is each of those written inside an IPv6
 * address (IPv4-mapped, NAT64, 6to4). Lists from the IANA special-purpose
 * address registries (RFC 6890 and its updates).
 */
export type AddressClass = "public" | "loopback" | "private" | "link-local" | "metadata" | "multicast" | "reserved" | "invalid";

const IPV4_RANGES: [string, number, AddressClass][] = [
  ["0.0.0.0", 8, "reserved"],
  ["10.0.0.0", 8, "private"],
  ["100.64.0.0", 10, "private"],
  ["127.0.0.0", 8, "loopback"],
  ["169.254.169.254", 32, "metadata"],
  ["169.254.0.0", 16, "link-local"],
  ["172.16.0.0", 12, "private"],
  ["192.0.0.0", 24, "reserved"],
  ["192.0.2.0", 24, "reserved"],
  ["192.168.0.0", 16, "private"],
  ["198.18.0.0", 15, "reserved"],
  ["198.51.100.0", 24, "reserved"],
  ["203.0.113.0", 24, "reserved"],
  ["224.0.0.0", 4, "multicast"],
  ["240.0.0.0", 4, "reserved"],
];

const IPV6_RANGES: [string, number, AddressClass][] = [
  ["::", 128, "reserved"],
  ["::1", 128, "loopback"],
  ["fd00:ec2::254", 128, "metadata"],
  ["fc00::", 7, "private"],
  ["fe80::", 10, "link-local"],
  ["fec0::", 10, "private"],
  ["ff00::", 8, "multicast"],
  ["2001:db8::", 32, "reserved"],
  ["100::", 64, "reserved"],
];

function blockList(ranges: [string, number, AddressClass][], type: "ipv4" | "ipv6") {
  return ranges.map(([address, prefix, kind]) => {
    const list = new net.BlockList();
    list.addSubnet(address, prefix, type);
    return { list, kind };
  });
}
const V4 = blockList(IPV4_RANGES, "ipv4");
const V6 = blockList(IPV6_RANGES, "ipv6");

/** The 16 bytes of an IPv6 address. */
function ipv6Bytes(address: string): number[] {
  let text = address.split("%", 1)[0]!.toLowerCase();
  const tail = /(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (tail) {
    const [a, b, c, d] = tail[1]!.split(".").map(Number) as [number, number, number, number];
    text = text.slice(0, -tail[1]!.length) + `${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head, rest] = text.includes("::") ? (text.split("::") as [string, string]) : [text, undefined];
  const left = head ? head.split(":") : [];
  const right = rest ? rest.split(":") : [];
  const groups = rest === undefined ? left : [...left, ...Array(8 - left.length - right.length).fill("0"), ...right];
  return groups.flatMap((g) => {
    const n = parseInt(g, 16);
    return [n >> 8, n & 0xff];
  });
}

/** The IPv4 address an IPv6 address carries (mapped, compatible, NAT64, 6to4), if any. */
function embeddedIpv4(bytes: number[]): string | undefined {
  const v4 = (at: number) => bytes.slice(at, at + 4).join(".");
  const zeros = (from: number, to: number) => bytes.slice(from, to).every((b) => b === 0);
  if (zeros(0, 10) && bytes[10] === 0xff && bytes[11] === 0xff) return v4(12); // ::ffff:a.b.c.d
  if (zeros(0, 12) && !zeros(12, 16)) return v4(12); // ::a.b.c.d (deprecated, still routed by some stacks)
  if (bytes[0] === 0x00 && bytes[1] === 0x64 && bytes[2] === 0xff && bytes[3] === 0x9b && zeros(4, 12)) return v4(12); // 64:ff9b::/96
  if (bytes[0] === 0x20 && bytes[1] === 0x02) return v4(2); // 2002::/16
  return undefined;
}

/** What kind of address this is; only "public" may receive a webhook. */
export function classifyAddress(address: string): AddressClass {
  const family = net.isIP(address.split("%", 1)[0]!);
  if (family === 4) return V4.find((r) => r.list.check(address, "ipv4"))?.kind ?? "public";
  if (family !== 6) return "invalid";
  const plain = address.split("%", 1)[0]!;
  const listed = V6.find((r) => r.list.check(plain, "ipv6"))?.kind;
  if (listed) return listed;
  const inner = embeddedIpv4(ipv6Bytes(address));
  return inner === undefined ? "public" : classifyAddress(inner);
}

/** Why a webhook may not go to this address, or undefined when it may. Loopback passes only when the operator allows it. */
export function refusalOf(address: string, allowLoopback: boolean): string | undefined {
  const kind = classifyAddress(address);
  if (kind === "public" || (kind === "loopback" && allowLoopback)) return undefined;
  return `${address} is a ${kind} address`;
}

/**
 * Why a webhook may not go to this host, as the URL names it: an address by
 * refusalOf; a name that is loopback whatever DNS says (localhost and its
 * subdomains, RFC 6761), also written with the root's trailing dot. Other
 * names are judged by their addresses once resolved. The one rule for an
 * endpoint when it is added and at each delivery.
 */
export function hostRefusal(host: string, allowLoopback: boolean): string | undefined {
  if (net.isIP(host) !== 0) return refusalOf(host, allowLoopback);
  const name = host.toLowerCase().replace(/\.+$/, "");
  if (allowLoopback || (name !== "localhost" && !name.endsWith(".localhost"))) return undefined;
  return `${host} is loopback`;
}
