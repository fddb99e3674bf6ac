import fs from "node:fs";
import path from "node:path";
import { expect, it } from "vitest";
import { type Action, ALLOWED_ROLES, memberChangeRefusal, ROLES, type Role } from "../../src/team/roles.js";

/**
 * docs/account-area.md's roles table says what the role matrix of
 * src/team/roles.ts allows: each row is one action of the matrix (or one
 * of the two rules beside it), each cell its yes or no. test/session-door/team.test.ts
 * checks the matrix against the service itself.
 */
const page = fs.readFileSync(path.resolve(import.meta.dirname, "../../docs/account-area.md"), "utf8");

/** What each row of the table is about, found by the words it starts with: an action of the matrix, or a rule beside it. */
const ROWS: [start: string, about: Action | ((role: Role) => boolean)][] = [
  ["read the balance", "read"],
  // A member's own second factor needs no role: the AccountService checks none for it.
  ["set up or turn off their own two-factor", () => true],
  ["create, limit, roll and revoke API keys", "manage_keys"],
  ["create, cancel, resume and delete evaluations, fit calibrations", "run_evaluations"],
  ["set balance alerts and webhook endpoints", "manage_alerts"],
  ["invite members", "manage_members"],
  ["grant, change or remove the owner role", (role) => memberChangeRefusal(role, { to: "owner" }) === undefined],
  ["require two-factor sign-in", "require_two_factor"],
];

const allows = (about: Action | ((role: Role) => boolean), role: Role) =>
  typeof about === "function" ? about(role) : ALLOWED_ROLES[about].includes(role);

/** The rows under "## Roles": the header names the roles, each cell starts with yes or no. */
function table(): { header: string[]; rows: string[][] } {
  const section = page.slice(page.indexOf("## Roles"), page.indexOf("\n## ", page.indexOf("## Roles") + 1));
  const lines = section.split("\n").filter((l) => l.startsWith("|"));
  const cells = (line: string) => line.split("|").slice(1, -1).map((c) => c.trim());
  return { header: cells(lines[0]!), rows: lines.slice(2).map(cells) };
}

it("the table's columns are the code's roles, in order", () => {
  expect(table().header).toEqual(["", ...ROLES]);
});

it("each row is one action, and each cell says what the role matrix allows", () => {
  const { rows } = table();
  expect(rows.map((r) => ROWS.filter(([start]) => r[0]!.startsWith(start)).length)).toEqual(rows.map(() => 1));
  expect(rows).toHaveLength(ROWS.length);
  for (const row of rows) {
    const [, about] = ROWS.find(([start]) => row[0]!.startsWith(start))!;
    expect({ row: row[0], cells: row.slice(1).map((c) => c.split(/[ ,]/)[0]) }).toEqual({
      row: row[0],
      cells: ROLES.map((role) => (allows(about, role) ? "yes" : "no")),
    });
  }
});

it("every action of the matrix has its row", () => {
  expect(Object.keys(ALLOWED_ROLES).filter((action) => !ROWS.some(([, about]) => about === action))).toEqual([]);
});
