import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { Member } from "../../gen/typesafe/account/v1/account_service_pb.js";
import type { AccountClient } from "./client.js";
import { byId, formatUtc, row, timeElement } from "./dom.js";

const ROLES = ["owner", "admin", "member", "viewer"] as const;

export interface TeamViewOptions {
  client: AccountClient;
  fail(err: unknown, where: HTMLElement): void;
  /** The signed-in member, for what the view offers them: the service decides, the page only hides what it would refuse. */
  me(): Member | undefined;
}

/**
 * The team view: the members with their roles; owners and admins invite
 * (the link shown once), change roles and remove members.
 */
export function createTeamView(options: TeamViewOptions): { load(): Promise<void>; clear(): void } {
  const { client } = options;
  const form = byId("invite-member-form", HTMLFormElement);
  const email = byId("invite-email", HTMLInputElement);
  const role = byId("invite-role", HTMLSelectElement);
  const error = byId("team-error", HTMLElement);
  const panel = byId("new-invite", HTMLElement);
  const url = byId("new-invite-url", HTMLElement);
  const table = byId("members-table", HTMLTableElement);
  const dialog = byId("remove-dialog", HTMLDialogElement);
  let removing: Member | undefined;

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    error.textContent = "";
    if (!email.value.trim()) {
      error.textContent = "Enter the email of the person to invite.";
      email.focus();
      return;
    }
    void client
      .inviteMember({ email: email.value.trim(), role: role.value })
      .then(async (invited) => {
        email.value = "";
        url.textContent = invited.inviteUrl;
        byId("new-invite-expires", HTMLElement).textContent = invited.expiresAt ? `at ${formatUtc(timestampDate(invited.expiresAt))}` : "in 24 hours";
        panel.hidden = false;
        panel.focus();
        await load();
      })
      .catch((err: unknown) => options.fail(err, error));
  });

  byId("dismiss-invite", HTMLButtonElement).addEventListener("click", () => {
    dismissInvite();
    email.focus();
  });

  dialog.addEventListener("close", () => {
    const member = removing;
    removing = undefined;
    if (dialog.returnValue !== "remove" || !member) return;
    error.textContent = "";
    void client
      .removeMember({ memberId: member.id })
      .then(() => load())
      .catch((err: unknown) => options.fail(err, error));
  });

  function dismissInvite(): void {
    url.textContent = "";
    panel.hidden = true;
  }

  function mayManage(): boolean {
    const me = options.me();
    return me?.role === "owner" || me?.role === "admin";
  }

  function memberRow(member: Member): HTMLTableRowElement {
    const actions = document.createElement("td");
    const roleCell = document.createElement("td");
    if (mayManage()) {
      const select = document.createElement("select");
      select.setAttribute("aria-label", `Role of ${member.email}`);
      for (const name of ROLES) select.append(new Option(name, name, false, name === member.role));
      select.addEventListener("change", () => {
        error.textContent = "";
        void client
          .setMemberRole({ memberId: member.id, role: select.value })
          .then(() => load())
          .catch((err: unknown) => {
            select.value = member.role;
            options.fail(err, error);
          });
      });
      roleCell.append(select);
      const remove = document.createElement("button");
      remove.type = "button";
      remove.textContent = "Remove";
      remove.setAttribute("aria-label", `Remove ${member.email}`);
      remove.addEventListener("click", () => {
        removing = member;
        byId("remove-text", HTMLElement).textContent = `${member.email} will be signed out at once and can no longer sign in.`;
        dialog.returnValue = "";
        dialog.showModal();
      });
      actions.append(remove);
    } else {
      roleCell.textContent = member.role;
    }
    const tr = row([
      member.email + (member.inviteAccepted ? "" : " (invited)"),
      roleCell,
      member.twoFactorEnabled ? "on" : "off",
      timeElement(member.createdAt ? timestampDate(member.createdAt) : undefined, ""),
      actions,
    ]);
    tr.dataset["memberId"] = member.id;
    return tr;
  }

  async function load(): Promise<void> {
    form.hidden = !mayManage();
    const { members } = await client.listMembers({});
    table.tBodies[0]!.replaceChildren(...members.map(memberRow));
  }

  return {
    load,
    clear() {
      dismissInvite();
      if (dialog.open) dialog.close();
      table.tBodies[0]!.replaceChildren();
      error.textContent = "";
    },
  };
}
