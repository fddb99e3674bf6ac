import { SourceFailure } from "./source-failure.js";

/** Reading a provider's answer body, bounded in size whatever the provider sends. */

/** Largest answer read from a provider; ten results never come near it. */
export const MAX_ANSWER_BYTES = 4 * 1024 * 1024;

/** Reads a body as UTF-8 text, refusing answers above MAX_ANSWER_BYTES without buffering them. */
export async function readText(res: Response, maxBytes = MAX_ANSWER_BYTES): Promise<string> {
  if (Number(res.headers.get("content-length") ?? 0) > maxBytes) {
    await res.body?.cancel();
    throw new SourceFailure("error", "upstream answer too large");
  }
  if (!res.body) return "";
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > maxBytes) {
      await reader.cancel();
      throw new SourceFailure("error", "upstream answer too large");
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks).toString("utf8");
}

/** Reads a JSON body; anything else (GDELT's text/html error page, truncated JSON) is an error. */
export async function readJson(res: Response): Promise<unknown> {
  const type = res.headers.get("content-type") ?? "";
  const text = await readText(res);
  if (!/json/i.test(type) && !/^\s*[[{]/.test(text)) {
    throw new SourceFailure("error", "upstream sent a non-JSON answer");
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (err) {
    throw new SourceFailure("error", "upstream sent unreadable JSON", { cause: err });
  }
}
