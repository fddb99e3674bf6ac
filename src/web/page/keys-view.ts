import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { ApiKey } from "../../gen/typesafe/account/v1/account_service_pb.js";
import { listAllKeys, type AccountClient } from "./client.js";
import { byId, emptyRow, keyLabel, row, timeElement } from "./dom.js";
import { describeBudget, describeLimits, fillLimits, readLimits } from "./key-limits-form.js";

/** What the keys view needs from the page: the client and one place to send failures. */
export interface KeysViewOptions {
  client: AccountClient;
  /** Shows the failure in the view (or returns to sign-in when the session ended). */
  fail(err: unknown, where: HTMLElement): void;
  /** Called with every key list read, so other views can name keys. */
  onKeys(keys: ApiKey[]): void;
}

/**
 * The keys view: create a key with its limits (its secret is shown once, held
 * only in the DOM until dismissed, never stored), list keys with their limits
 * and budget this period, change a key's limits, roll a key (the new secret
 * shown as a new key's), revoke one after a confirmation dialog.
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
  const limitsDialog = byId("limits-dialog", HTMLDialogElement);
  const rollDialog = byId("roll-dialog", HTMLDialogElement);
  let editing: ApiKey | undefined;
  let rolling: ApiKey | undefined;

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    error.textContent = "";
    void client
      .createKey({ name: nameInput.value.trim(), limits: readLimits("create") })
      .then(async (created) => {
        nameInput.value = "";
        fillLimits("create", undefined);
        await showSecret(created.secret);
      })
      .catch((err: unknown) => options.fail(err, error));
  });

  async function showSecret(value: string): Promise<void> {
    secret.textContent = value;
    copyStatus.textContent = "";
    panel.hidden = false;
    panel.focus();
    await load();
  }

  limitsDialog.addEventListener("close", () => {
    const key = editing;
    editing = undefined;
    if (limitsDialog.returnValue !== "save" || !key) return;
    error.textContent = "";
    void client
      .updateKey({ keyId: key.id, limits: readLimits("edit") })
      .then(() => load())
      .catch((err: unknown) => options.fail(err, error));
  });

  rollDialog.addEventListener("close", () => {
    const key = rolling;
    rolling = undefined;
    if (rollDialog.returnValue !== "roll" || !key) return;
    error.textContent = "";
    void client
      .rollKey({ keyId: key.id, oldKeyExpiresInSeconds: Number(byId("roll-grace", HTMLSelectElement).value) })
      .then((rolled) => showSecret(rolled.secret))
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

  function editLimits(key: ApiKey): void {
    editing = key;
    byId("limits-key", HTMLElement).textContent = describe(key);
    fillLimits("edit", key.limits);
    limitsDialog.returnValue = "";
    limitsDialog.showModal();
  }

  function confirmRoll(key: ApiKey): void {
    rolling = key;
    byId("roll-text", HTMLElement).textContent =
      `A new secret replaces ${describe(key)}, with the same name and limits; it is shown once. Until the old key stops, both work.`;
    rollDialog.returnValue = "";
    rollDialog.showModal();
  }

  function actionButton(label: string, key: ApiKey, onClick: () => void): HTMLButtonElement {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "secondary";
    button.textContent = label;
    button.setAttribute("aria-label", `${label} ${describe(key)}`);
    button.addEventListener("click", onClick);
    return button;
  }

  function keyRow(key: ApiKey): HTMLTableRowElement {
    const state = document.createElement("span");
    if (key.revokedAt) state.append("revoked ", timeElement(timestampDate(key.revokedAt)));
    else state.textContent = "active";
    const actions = document.createElement("td");
    if (!key.revokedAt) {
      actions.append(actionButton("Limits", key, () => editLimits(key)), actionButton("Roll", key, () => confirmRoll(key)));
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
      describeLimits(key.limits),
      describeBudget(key),
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
      if (limitsDialog.open) limitsDialog.close();
      if (rollDialog.open) rollDialog.close();
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
