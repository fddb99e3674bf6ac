import {
  asArray, asNumber, asRecord, asString, callUpstream, endpoint, failForStatus, readJson, requireArray, requireRecord,
  windowCutoffMs, type SearchSource, type SourceSettings,
} from "./types.js";

/**
 * Exa search. Its window is exact (startPublishedDate is an instant), and
 * every answer states its upstream cost, which we log to check our price list.
 */
export function createExaSource(settings: SourceSettings): SearchSource {
  return {
    id: "exa",
    version: 1,
    async search(call) {
      const body: Record<string, unknown> = {
        query: call.query,
        type: "auto",
        numResults: 10,
        contents: { highlights: { maxCharacters: 400 } },
      };
      const cutoff = windowCutoffMs(call.window, call.nowMs);
      if (cutoff !== undefined) body["startPublishedDate"] = new Date(cutoff).toISOString();
      const res = await callUpstream(settings, endpoint(settings.baseUrl, "/search"), call, {
        method: "POST",
        headers: { Accept: "application/json", "Content-Type": "application/json", "x-api-key": settings.key ?? "" },
        body: JSON.stringify(body),
      });
      failForStatus(res, call.nowMs);
      const answer = requireRecord(await readJson(res));
      const results = requireArray(answer["results"]);
      const cost = asNumber(asRecord(answer["costDollars"])?.["total"]);
      if (cost !== undefined) settings.logger.debug("exa upstream cost", { source: "exa", costDollars: cost });
      return {
        items: results.map((raw) => {
          const r = asRecord(raw) ?? {};
          const published = asString(r["publishedDate"]);
          return {
            title: asString(r["title"]),
            url: asString(r["url"]),
            snippet: asArray(r["highlights"]).map(asString).filter((h) => h !== "").join(" … "),
            publishedAt: published === "" ? null : published,
          };
        }),
      };
    },
  };
}
