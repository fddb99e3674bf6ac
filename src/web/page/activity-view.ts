import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { ActivityEvent } from "../../gen/typesafe/account/v1/account_service_pb.js";
import type { AccountClient } from "./client.js";
import { byId, emptyRow, row, timeElement } from "./dom.js";
import type { ActivityKind } from "../../team/activity.js";

const PAGE_SIZE = 50;
/** Event kinds as sentences; an unknown kind is shown as it is. */
const KIND_TEXT: Record<ActivityKind, string> = {
  signed_in: "signed in",
  sign_in_failed: "failed to sign in",
  signed_out: "signed out",
  invite_accepted: "accepted an invite",
  key_created: "created a key",
  key_revoked: "revoked a key",
  key_limits_changed: "changed a key's limits",
  key_rolled: "rolled a key",
  credits_granted: "granted credits",
  member_invited: "invited a member",
  member_removed: "removed a member",
  member_role_changed: "changed a member's role",
  two_factor_enabled: "turned on two-factor sign-in",
  two_factor_disabled: "turned off two-factor sign-in",
  two_factor_required_changed: "changed whether two-factor sign-in is required",
  alerts_set: "set the balance alerts",
  webhook_endpoint_added: "added a webhook endpoint",
  webhook_endpoint_removed: "removed a webhook endpoint",
  webhook_secret_rotated: "rotated a webhook secret",
  webhook_endpoint_disabled: "disabled a webhook endpoint",
  webhook_endpoint_enabled: "enabled a webhook endpoint",
  evaluation_created: "started an evaluation",
  evaluation_cancelled: "cancelled an evaluation",
  evaluation_resumed: "resumed an evaluation",
  evaluation_deleted: "deleted an evaluation",
  evaluation_stopped: "stopped an evaluation",
  evaluation_finished: "finished an evaluation",
  calibration_fitted: "fitted a calibration",
};

/** What the activity view needs from the page. */
export interface ActivityViewOptions {
  client: AccountClient;
  fail(err: unknown, where: HTMLElement): void;
}

/** The activity view: who did what and when, newest first; older pages are appended on request. */
export function createActivityView(options: ActivityViewOptions): { load(): Promise<void>; clear(): void } {
  const { client } = options;
  const error = byId("activity-error", HTMLElement);
  const table = byId("activity-table", HTMLTableElement);
  const more = byId("activity-more", HTMLButtonElement);
  let nextToken = "";

  more.addEventListener("click", () => void append(nextToken));

  function eventRow(event: ActivityEvent): HTMLTableRowElement {
    const tr = row([timeElement(event.at ? timestampDate(event.at) : undefined, ""), event.actor, KIND_TEXT[event.kind as ActivityKind] ?? event.kind, event.detail]);
    tr.dataset["kind"] = event.kind;
    return tr;
  }

  async function append(token: string): Promise<void> {
    error.textContent = "";
    try {
      const page = await client.listActivity({ pageSize: PAGE_SIZE, pageToken: token });
      const body = table.tBodies[0]!;
      const rows = page.events.map(eventRow);
      if (token === "") body.replaceChildren(...(rows.length > 0 ? rows : [emptyRow(table, "Nothing yet.")]));
      else body.append(...rows);
      nextToken = page.nextPageToken;
      more.disabled = nextToken === "";
    } catch (err) {
      options.fail(err, error);
    }
  }

  return {
    load: () => append(""),
    clear() {
      table.tBodies[0]!.replaceChildren();
      nextToken = "";
      more.disabled = true;
      error.textContent = "";
    },
  };
}
