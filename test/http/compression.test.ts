import zlib from "node:zlib";
import { ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { describeError } from "../../src/errors.js";
import { ACCEPTED_ENCODING_NAMES, compressionNamed, decompressBody } from "../../src/http/compression.js";

/** The one decompression step every door uses: bounded by the body limit while inflating, every failure a caller's error. */
const MAX = 96 * 1024;
const gzip = compressionNamed("gzip")!;
const br = compressionNamed("br")!;

describe("compressionNamed", () => {
  it.each([
    [null, null],
    ["identity", null],
    ["gzip", "gzip"],
    ["br", "br"],
    ["zstd", undefined],
    ["GZIP", undefined],
  ] as const)("%s → %s", (encoding, name) => {
    const found = compressionNamed(encoding);
    expect(found === null || found === undefined ? found : found.name).toBe(name);
  });

  it("lists what it accepts as the accept-encoding headers do", () => {
    expect(ACCEPTED_ENCODING_NAMES).toBe("gzip,br");
  });
});

describe("decompressBody", () => {
  const reasonOf = (result: Uint8Array | ConnectError) => (result instanceof ConnectError ? describeError(result).reason : "bytes");

  it.each([
    ["gzip", gzip, (b: Uint8Array) => zlib.gzipSync(b)],
    ["br", br, (b: Uint8Array) => zlib.brotliCompressSync(b)],
  ] as const)("%s: exactly the limit inflates; one byte more is PAYLOAD_TOO_LARGE; damaged data is INVALID_ARGUMENT", async (_name, compression, compress) => {
    const atLimit = await decompressBody(compression, compress(new Uint8Array(MAX).fill(7)), MAX);
    expect(atLimit instanceof Uint8Array && atLimit.byteLength).toBe(MAX);
    expect(reasonOf(await decompressBody(compression, compress(new Uint8Array(MAX + 1)), MAX))).toBe("PAYLOAD_TOO_LARGE");
    const damaged = Uint8Array.from(compress(new TextEncoder().encode("hello, hello, hello")));
    const middle = Math.floor(damaged.length / 2);
    damaged[middle] = damaged[middle]! ^ 0xff;
    expect(reasonOf(await decompressBody(compression, damaged.subarray(0, damaged.length - 2), MAX))).toBe("INVALID_ARGUMENT");
  });

  it("a bomb is refused without being inflated whole: the error comes back with the limit", async () => {
    const bomb = zlib.gzipSync(new Uint8Array(64 * 1024 * 1024));
    const result = await decompressBody(gzip, bomb, MAX);
    expect(result).toBeInstanceOf(ConnectError);
    expect(describeError(result).detail.metadata["max_bytes"]).toBe(String(MAX));
  });
});
