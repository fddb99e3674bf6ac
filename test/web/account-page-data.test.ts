import { create } from "@bufbuild/protobuf";
import { timestampFromDate } from "@bufbuild/protobuf/wkt";
import { describe, expect, it } from "vitest";
import { UsageBucketSchema } from "../../src/gen/typesafe/account/v1/account_service_pb.js";
import { formatCredits, formatUtc, keyLabel } from "../../src/web/page/dom.js";
import { dailyUsage } from "../../src/web/page/usage-chart.js";
import { csvHref } from "../../src/web/page/usage-view.js";

function bucket(day: string, endpoint: string, calls: number, chargedCredits: number) {
  return create(UsageBucketSchema, { start: timestampFromDate(new Date(`${day}T00:00:00Z`)), endpoint, calls, chargedCredits });
}

describe("dailyUsage: the chart's series", () => {
  const until = new Date("2026-11-26T07:30:00Z");

  it("has every UTC day of the range, oldest first, ending on until's day, with zeros where nothing ran", () => {
    const usage = dailyUsage([], until, 30);
    expect(usage.days).toHaveLength(30);
    expect(usage.days[0]).toBe("2026-10-28");
    expect(usage.days.at(-1)).toBe("2026-11-26");
    expect(usage.endpoints).toEqual(["decide", "search"]);
    expect(usage.calls["decide"]).toEqual(Array(30).fill(0));
    expect(usage.credits["search"]).toEqual(Array(30).fill(0));
  });

  it("puts each bucket on its day and endpoint, adds an endpoint it does not know, and drops days outside the range", () => {
    const usage = dailyUsage(
      [bucket("2026-11-26", "decide", 3, 0.25), bucket("2026-11-25", "search", 2, 0.5), bucket("2026-11-26", "rerank", 1, 1), bucket("2026-10-27", "decide", 9, 9)],
      until,
      30,
    );
    expect(usage.endpoints).toEqual(["decide", "search", "rerank"]);
    expect(usage.calls["decide"]!.at(-1)).toBe(3);
    expect(usage.credits["decide"]!.at(-1)).toBe(0.25);
    expect(usage.calls["search"]!.at(-2)).toBe(2);
    expect(usage.calls["rerank"]!.at(-1)).toBe(1);
    expect(usage.calls["decide"]!.reduce((a, b) => a + b, 0)).toBe(3);
  });

  it("adds two buckets of one day and endpoint (an hourly summary) together", () => {
    const usage = dailyUsage([bucket("2026-11-26", "decide", 1, 0.1), bucket("2026-11-26", "decide", 2, 0.2)], until, 1);
    expect(usage.days).toEqual(["2026-11-26"]);
    expect(usage.calls["decide"]).toEqual([3]);
    expect(usage.credits["decide"]![0]).toBeCloseTo(0.3, 12);
  });
});

describe("the page's formats", () => {
  it.each([
    [3.25, "3.25"],
    [0, "0"],
    [0.000001, "0.000001"],
    [1234.5, "1,234.5"],
    [0.0000004, "0"],
  ])("formatCredits(%s) is %s", (credits, text) => {
    expect(formatCredits(credits)).toBe(text);
  });

  it("formatUtc writes minutes in UTC, whatever the local zone", () => {
    expect(formatUtc(new Date("2026-11-26T07:05:59.900Z"))).toBe("2026-11-26 07:05 UTC");
  });

  it("keyLabel shows the prefix and the last four characters only", () => {
    expect(keyLabel("ts_live_", "Ab3x")).toBe("ts_live_…Ab3x");
  });

  it.each([
    ["", undefined, "/account/v1/usage.csv"],
    ["decide", undefined, "/account/v1/usage.csv?endpoint=decide"],
    ["", new Date("2026-11-19T07:00:00Z"), "/account/v1/usage.csv?since=2026-11-19T07%3A00%3A00.000Z"],
    ["search", new Date("2026-11-19T07:00:00Z"), "/account/v1/usage.csv?endpoint=search&since=2026-11-19T07%3A00%3A00.000Z"],
  ])("csvHref(%j, %s) is %s", (endpoint, since, href) => {
    expect(csvHref(endpoint, since)).toBe(href);
  });
});
