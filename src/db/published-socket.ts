import fs from "node:fs/promises";
import path from "node:path";

/**
 * Where a running service publishes its embedded store, so the operator CLI
 * can reach the store the service owns. Written by the embedded store; its
 * own module so the store and the CLI's database code need not import each other.
 */
export function socketFilePath(dataDir: string): string {
  return path.join(dataDir, "socket.json");
}

/** The published store, when its owner is still alive; undefined otherwise. */
export async function readPublishedSocket(dataDir: string): Promise<{ url: string; pid: number } | undefined> {
  try {
    const info = JSON.parse(await fs.readFile(socketFilePath(dataDir), "utf8")) as { url: string; pid: number };
    process.kill(info.pid, 0); // throws when no such process
    return info;
  } catch {
    return undefined;
  }
}

/** The URL the folder's owner published, without checking that it is alive (for messages). */
export async function publishedUrl(dataDir: string): Promise<string | undefined> {
  try {
    return (JSON.parse(await fs.readFile(socketFilePath(dataDir), "utf8")) as { url?: string }).url;
  } catch {
    return undefined;
  }
}
