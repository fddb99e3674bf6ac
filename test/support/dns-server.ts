import dgram from "node:dgram";
import net from "node:net";

/**
 * A DNS server on loopback (UDP) that answers A and AAAA questions from a
 * table, so the service's resolver can be pointed at a local answer. The
 * message format is RFC 1035 §4.1 (header, question, answer with a name
 * pointer to the question, RFC 1035 §4.1.4) and RFC 3596 for AAAA; a name
 * not in the table gets NXDOMAIN (RCODE 3), a type not in it an empty answer.
 */
export async function startDnsServer(table: Record<string, string[]>): Promise<{ address: string; queries: string[]; close(): Promise<void> }> {
  const socket = dgram.createSocket("udp4");
  const queries: string[] = [];
  socket.on("message", (query, peer) => {
    let offset = 12;
    const labels: string[] = [];
    while (query[offset] !== 0 && offset < query.length) {
      const length = query[offset]!;
      labels.push(query.subarray(offset + 1, offset + 1 + length).toString("ascii"));
      offset += length + 1;
    }
    const questionEnd = offset + 5;
    const type = query.readUInt16BE(offset + 1);
    const name = labels.join(".").toLowerCase();
    queries.push(`${name} ${type === 28 ? "AAAA" : type === 1 ? "A" : type}`);
    const known = table[name];
    const wanted = (known ?? []).filter((a) => net.isIP(a) === (type === 28 ? 6 : type === 1 ? 4 : 0));
    const answers = wanted.map((address) => {
      const rdata = net.isIP(address) === 4 ? Buffer.from(address.split(".").map(Number)) : ipv6Bytes(address);
      const record = Buffer.alloc(12);
      record.writeUInt16BE(0xc00c, 0); // pointer to the question's name
      record.writeUInt16BE(type, 2);
      record.writeUInt16BE(1, 4); // class IN
      record.writeUInt32BE(60, 6); // TTL
      record.writeUInt16BE(rdata.length, 10);
      return Buffer.concat([record, rdata]);
    });
    const header = Buffer.alloc(12);
    query.copy(header, 0, 0, 2); // the query's id
    header.writeUInt16BE(0x8180 | (known ? 0 : 3), 2); // response, recursion desired and available, RCODE
    header.writeUInt16BE(1, 4);
    header.writeUInt16BE(answers.length, 6);
    socket.send(Buffer.concat([header, query.subarray(12, questionEnd), ...answers]), peer.port, peer.address);
  });
  await new Promise<void>((resolve) => socket.bind(0, "127.0.0.1", resolve));
  return {
    address: `127.0.0.1:${socket.address().port}`,
    queries,
    close: () => new Promise<void>((resolve) => socket.close(() => resolve())),
  };
}

function ipv6Bytes(address: string): Buffer {
  const [head, tail] = address.split("::") as [string, string | undefined];
  const left = head ? head.split(":") : [];
  const right = tail ? tail.split(":") : [];
  const groups = tail === undefined ? left : [...left, ...Array(8 - left.length - right.length).fill("0"), ...right];
  const bytes = Buffer.alloc(16);
  groups.forEach((g, i) => bytes.writeUInt16BE(parseInt(g, 16), i * 2));
  return bytes;
}
