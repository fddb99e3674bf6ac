import fs from "node:fs";
import path from "node:path";
import { expect, it } from "vitest";

/**
 * The embedded model runs on each Linux CPU node-llama-cpp publishes a build
 * for: package.json replaces only the GPU builds (and the RISC-V one, which
 * the registry lacks at the pinned version), and the lock installs the real
 * CPU builds, as docs/decisions.md says.
 */
const root = path.resolve(import.meta.dirname, "../..");
const pkg = JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf8")) as { dependencies: Record<string, string>; overrides: Record<string, string> };
const lock = JSON.parse(fs.readFileSync(path.join(root, "package-lock.json"), "utf8")) as { packages: Record<string, { version?: string; integrity?: string; cpu?: string[]; link?: boolean }> };

it("replaces only the GPU builds (and linux-riscv64) with the empty stand-in", () => {
  const replaced = Object.entries(pkg.overrides)
    .filter(([, to]) => to === "file:./vendor/absent-binary")
    .map(([name]) => name)
    .sort();
  expect(replaced).toEqual(["@node-llama-cpp/linux-riscv64", "@node-llama-cpp/linux-x64-cuda", "@node-llama-cpp/linux-x64-cuda-ext", "@node-llama-cpp/linux-x64-vulkan"]);
});

it.each([
  ["linux-x64", "x64"],
  ["linux-arm64", "arm64"],
  ["linux-armv7l", "arm"],
])("the lock installs the published %s build at node-llama-cpp's version", (name, cpu) => {
  const entries = Object.entries(lock.packages).filter(([at]) => at.endsWith(`node_modules/@node-llama-cpp/${name}`));
  expect(entries).toHaveLength(1);
  const [, entry] = entries[0]!;
  expect(entry.link).toBeUndefined();
  expect(entry.version).toBe(pkg.dependencies["node-llama-cpp"]);
  expect(entry.integrity).toMatch(/^sha512-/);
  expect(entry.cpu).toContain(cpu);
});
