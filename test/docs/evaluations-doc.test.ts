import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { LOG_LOSS_EPS, noulMetrics } from "../../src/evaluation/metrics.js";
import { DEFAULT_FOLDS, DEFAULT_SEED, ISOTONIC_TIE, MIN_CALIBRATION_EXAMPLES } from "../../src/evaluation/calibration-fit.js";
import { LOGIT_EPS } from "../../src/evaluation/calibration-apply.js";

/** docs/evaluations.md stays true: its worked example is recomputed from its own tables, and its constants are the code's. */
const page = fs.readFileSync(path.resolve(import.meta.dirname, "../../docs/evaluations.md"), "utf8");
const example = page.split("## A worked example")[1]!.split("\n## ")[0]!;

const answers = [...example.matchAll(/^\| (\d+) \| ([\d.]+) \| (true|false) \|$/gm)].map((m) => ({
  exampleId: m[1]!,
  probabilityTrue: Number(m[2]),
  label: m[3] === "true",
}));
const bins = [...example.matchAll(/^\| (\d) \| [[(]([\d.]+), ([\d.]+)\] \| (\d+) \| ([\d.]+) \| ([\d.]+) \| (\d+)\/(\d+) × ([\d.]+) = ([\d.]+) \|$/gm)].map((m) => ({
  bin: Number(m[1]),
  binLower: Number(m[2]),
  binUpper: Number(m[3]),
  count: Number(m[4]),
  meanPredicted: Number(m[5]),
  observedFrequency: Number(m[6]),
  weight: Number(m[7]) / Number(m[8]),
  gap: Number(m[9]),
  product: Number(m[10]),
}));
const stated = (name: string) => Number(new RegExp(`^- ${name} = .*\\*\\*([\\d.]+)\\*\\*`, "m").exec(example)![1]);

describe("docs/evaluations.md, the worked example", () => {

  it("has eight answers and five non-empty bins", () => {
    expect(answers).toHaveLength(8);
    expect(bins.map((b) => b.bin)).toEqual([0, 2, 6, 8, 9]);
  });

  it("its bin table is the reliability table, row by row, and each product is its weight times its gap", () => {
    const m = noulMetrics(answers);
    expect(m.reliability.filter((b) => b.count > 0).map((b) => [b.binLower, b.binUpper, b.count])).toEqual(bins.map((b) => [b.binLower, b.binUpper, b.count]));
    bins.forEach((b) => {
      const row = m.reliability[b.bin]!;
      expect(row.meanPredicted).toBeCloseTo(b.meanPredicted, 12);
      expect(row.observedFrequency).toBeCloseTo(b.observedFrequency, 12);
      expect(b.weight).toBeCloseTo(b.count / answers.length, 12);
      expect(b.gap).toBeCloseTo(Math.abs(b.meanPredicted - b.observedFrequency), 12);
      expect(b.product).toBeCloseTo(b.weight * b.gap, 12);
    });
  });

  it("its ECE, Brier, accuracy and AUROC are what the code computes", () => {
    const m = noulMetrics(answers);
    expect(stated("ECE")).toBeCloseTo(bins.reduce((s, b) => s + b.product, 0), 12);
    expect(m.ece).toBeCloseTo(stated("ECE"), 12);
    expect(m.brier).toBeCloseTo(stated("Brier"), 12);
    expect(m.accuracy).toBeCloseTo(stated("accuracy"), 12);
    expect(m.auroc).toBeCloseTo(stated("AUROC"), 6);
  });
});

describe("docs/evaluations.md, the constants", () => {
  it.each([
    ["the log loss's ε", `\`ε = ${LOG_LOSS_EPS}\``],
    ["what a certain, wrong answer costs", `costs about ${(-Math.log(LOG_LOSS_EPS)).toFixed(2)}`],
    ["the logarithm's floor", `\`${LOGIT_EPS}\` before a logarithm`],
    ["isotonic's tie", `closer than \`${ISOTONIC_TIE}\``],
    ["the fewest answers a fit takes", `at least ${MIN_CALIBRATION_EXAMPLES} labelled answers`],
    ["the folds and the seed", `into ${DEFAULT_FOLDS} folds along a seeded permutation (seed ${DEFAULT_SEED},`],
  ])("%s", (_, text) => {
    expect(page).toContain(text);
  });
});
