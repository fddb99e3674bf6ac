import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { ApiKey } from "../../gen/typesafe/account/v1/account_service_pb.js";
import { listAllKeys, type AccountClient } from "./client.js";
import { byId, emptyRow, keyLabel, row, timeElement } from "./dom.js";

/** What the keys view needs from the page: the client and one place to send failures. */
export interface KeysViewOptions {
  client: AccountClient;
  /** Shows the failure in the view (or returns to sign-in when the session ended). */
  fail(err: unknown, where: HTMLElement): void;
  /** Called with every key list read, so other views can name keys. */
  onKeys(keys: ApiKey[]): void;
}

/**
 * The keys view: create a key (its secret is shown once, held only in the
 * DOM until dismissed, never stored), list keys, revoke one after a
 * confirmation dialog.
 */
export function createKeysView(options: KeysViewOptions): { load(): Promise<void>; clear(): void } {
  const { client } = options;
  const form = byId("create-key-form", HTMLFormElement);
  const nameInput = byId("key-name", HTMLInputElement);
  const error = byId("keys-error", HTMLElement);
  const panel = byId("new-key", HTMLElement);
  const secret = byId("new-key-secret", HTMLElement);
  const copyStatus = byId("copy-status", HTMLElement);
  const table = byId("keys-table", HTMLTableElement);
  const dialog = byId("revoke-dialog", HTMLDialogElement);
  const dialogText = byId("revoke-text", HTMLElement);
  let revoking: ApiKey | undefined;

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    error.textContent = "";
    void client
      .createKey({ name: nameInput.value.trim() })
      .then(async (created) => {
        nameInput.value = "";
        secret.textContent = created.secret;
        copyStatus.textContent = "";
        panel.hidden = false;
        panel.focus();
        await load();
      })
      .catch((err: unknown) => options.fail(err, error));
  });

  byId("copy-key", HTMLButtonElement).addEventListener("click", () => {
    navigator.clipboard.writeText(secret.textContent ?? "").then(
      () => (copyStatus.textContent = "Copied to the clipboard."),
      () => {
        // No clipboard access (an insecure origin or a refused permission): select it for Ctrl+C.
        getSelection()?.selectAllChildren(secret);
        copyStatus.textContent = "Selected: press Ctrl+C (⌘C) to copy.";
      },
    );
  });

  byId("dismiss-key", HTMLButtonElement).addEventListener("click", () => {
    dismissSecret();
    nameInput.focus();
  });

  dialog.addEventListener("close", () => {
    const key = revoking;
    revoking = undefined;
    if (dialog.returnValue !== "revoke" || !key) return;
    error.textContent = "";
    void client
      .revokeKey({ keyId: key.id })
      .then(() => load())
      .catch((err: unknown) => options.fail(err, error));
  });

  function dismissSecret(): void {
    secret.textContent = "";
    copyStatus.textContent = "";
    panel.hidden = true;
  }

  function confirmRevoke(key: ApiKey): void {
    revoking = key;
    dialogText.textContent = `Once revoked, ${describe(key)} stops working: every call made with it is refused from then on. This cannot be undone.`;
    dialog.returnValue = "";
    dialog.showModal();
  }

  function keyRow(key: ApiKey): HTMLTableRowElement {
    const state = document.createElement("span");
    if (key.revokedAt) state.append("revoked ", timeElement(timestampDate(key.revokedAt)));
    else state.textContent = "active";
    const actions = document.createElement("td");
    if (!key.revokedAt) {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = "Revoke";
      button.setAttribute("aria-label", `Revoke ${describe(key)}`);
      button.addEventListener("click", () => confirmRevoke(key));
      actions.append(button);
    }
    const code = document.createElement("code");
    code.textContent = keyLabel(key.prefix, key.last4);
    const tr = row([
      key.name || "(no name)",
      code,
      timeElement(key.createdAt ? timestampDate(key.createdAt) : undefined, ""),
      key.createdBy,
      timeElement(key.lastUsedAt ? timestampDate(key.lastUsedAt) : undefined),
      state,
      actions,
    ]);
    tr.dataset["keyId"] = key.id;
    if (key.revokedAt) tr.className = "revoked";
    return tr;
  }

  async function load(): Promise<void> {
    const keys = await listAllKeys(client);
    options.onKeys(keys);
    const body = table.tBodies[0]!;
    body.replaceChildren(...(keys.length > 0 ? keys.map(keyRow) : [emptyRow(table, "No keys yet.")]));
  }

  return {
    load,
    clear() {
      dismissSecret();
      if (dialog.open) dialog.close();
      table.tBodies[0]!.replaceChildren();
      error.textContent = "";
    },
  };
}

/** "the key “ci” (ts_…abcd)": how the page names a key in sentences. */
function describe(key: ApiKey): string {
  const label = keyLabel(key.prefix, key.last4);
  return key.name ? `the key “${key.name}” (${label})` : `the key ${label}`;
}
