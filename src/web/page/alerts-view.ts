import { timestampDate } from "@bufbuild/protobuf/wkt";
import type { Account, WebhookDelivery, WebhookEndpoint } from "../../gen/typesafe/account/v1/account_service_pb.js";
import type { AccountClient } from "./client.js";
import { byId, emptyRow, formatCredits, row, timeElement } from "./dom.js";

/** What the alerts view needs from the page. */
export interface AlertsViewOptions {
  client: AccountClient;
  fail(err: unknown, where: HTMLElement): void;
  /** The account as read again, so the low-balance banner follows a change of thresholds. */
  onAccount(account: Account): void;
}

/**
 * The alerts view: the balance thresholds, the webhook endpoints (a new
 * secret is shown once, held only in the DOM until dismissed) and the latest
 * deliveries with every attempt, a replay and a test event.
 */
export function createAlertsView(options: AlertsViewOptions): { load(): Promise<void>; clear(): void } {
  const { client } = options;
  const thresholds = byId("alert-thresholds", HTMLInputElement);
  const alertsState = byId("alerts-state", HTMLElement);
  const alertsError = byId("alerts-error", HTMLElement);
  const urlInput = byId("endpoint-url", HTMLInputElement);
  const endpointsError = byId("endpoints-error", HTMLElement);
  const secretPanel = byId("new-secret", HTMLElement);
  const secretValue = byId("new-secret-value", HTMLElement);
  const endpointsTable = byId("endpoints-table", HTMLTableElement);
  const deliveriesTable = byId("deliveries-table", HTMLTableElement);
  const urls = new Map<string, string>();

  byId("alerts-form", HTMLFormElement).addEventListener("submit", (event) => {
    event.preventDefault();
    alertsError.textContent = "";
    const parts = thresholds.value.split(",").map((p) => p.trim()).filter((p) => p !== "");
    const values = parts.map(Number);
    if (values.some((v) => !Number.isFinite(v))) {
      thresholds.setAttribute("aria-invalid", "true");
      alertsError.textContent = "Write each threshold as a number of credits, e.g. 10, 2.5";
      return;
    }
    thresholds.removeAttribute("aria-invalid");
    void client
      .setAlerts({ thresholdsCredits: values })
      .then(async () => load())
      .catch((err: unknown) => options.fail(err, alertsError));
  });

  byId("endpoint-form", HTMLFormElement).addEventListener("submit", (event) => {
    event.preventDefault();
    endpointsError.textContent = "";
    void client
      .addWebhookEndpoint({ url: urlInput.value.trim() })
      .then(async (added) => {
        urlInput.value = "";
        showSecret(added.secret);
        await load();
      })
      .catch((err: unknown) => options.fail(err, endpointsError));
  });

  byId("dismiss-secret", HTMLButtonElement).addEventListener("click", () => {
    hideSecret();
    urlInput.focus();
  });
  byId("deliveries-refresh", HTMLButtonElement).addEventListener("click", () => {
    void loadDeliveries().catch((err: unknown) => options.fail(err, endpointsError));
  });

  function showSecret(secret: string): void {
    secretValue.textContent = secret;
    secretPanel.hidden = false;
    secretPanel.focus();
  }

  function hideSecret(): void {
    secretValue.textContent = "";
    secretPanel.hidden = true;
  }

  function button(text: string, label: string, action: () => Promise<unknown>): HTMLButtonElement {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = text;
    b.setAttribute("aria-label", label);
    b.addEventListener("click", () => {
      endpointsError.textContent = "";
      void action()
        .then(() => load())
        .catch((err: unknown) => options.fail(err, endpointsError));
    });
    return b;
  }

  function endpointRow(endpoint: WebhookEndpoint): HTMLTableRowElement {
    const actions = document.createElement("td");
    const id = endpoint.id;
    actions.append(
      button("Send test event", `Send test event to ${endpoint.url}`, () => client.sendTestWebhook({ endpointId: id })),
      button("Rotate secret", `Rotate secret of ${endpoint.url}`, async () => showSecret((await client.rotateWebhookSecret({ endpointId: id })).secret)),
      button("Remove", `Remove ${endpoint.url}`, () => client.removeWebhookEndpoint({ endpointId: id })),
    );
    if (!endpoint.enabled) actions.append(button("Enable", `Enable ${endpoint.url} again`, () => client.enableWebhookEndpoint({ endpointId: id })));
    const state = endpoint.enabled ? "enabled" : `disabled: ${endpoint.disabledReason}`;
    const tr = row([endpoint.url, state, timeElement(endpoint.createdAt ? timestampDate(endpoint.createdAt) : undefined, ""), actions]);
    tr.dataset["endpointId"] = id;
    return tr;
  }

  function attemptsText(delivery: WebhookDelivery): string {
    if (delivery.attempts.length === 0) return "none yet";
    return delivery.attempts.map((a) => `#${a.attempt}: ${a.status === 0 ? `no answer (${a.error})` : a.status} in ${a.latencyMs} ms`).join("; ");
  }

  function deliveryRow(delivery: WebhookDelivery): HTMLTableRowElement {
    const actions = document.createElement("td");
    if (delivery.state !== "pending") {
      actions.append(button("Replay", `Replay the ${delivery.eventType} event`, () => client.replayWebhookDelivery({ deliveryId: delivery.id })));
    }
    const code = document.createElement("code");
    code.textContent = delivery.webhookId;
    const tr = row([
      delivery.eventType,
      timeElement(delivery.eventAt ? timestampDate(delivery.eventAt) : undefined, ""),
      urls.get(delivery.endpointId) ?? "(removed)",
      delivery.state,
      attemptsText(delivery),
      code,
      actions,
    ]);
    tr.dataset["deliveryId"] = delivery.id;
    tr.dataset["state"] = delivery.state;
    return tr;
  }

  async function loadDeliveries(): Promise<void> {
    const { deliveries } = await client.listWebhookDeliveries({ pageSize: 20 });
    deliveriesTable.tBodies[0]!.replaceChildren(...(deliveries.length > 0 ? deliveries.map(deliveryRow) : [emptyRow(deliveriesTable, "No deliveries yet.")]));
  }

  async function load(): Promise<void> {
    const [{ alerts }, { endpoints }, { account }] = await Promise.all([client.getAlerts({}), client.listWebhookEndpoints({}), client.getAccount({})]);
    if (account) options.onAccount(account);
    if (document.activeElement !== thresholds) thresholds.value = (alerts?.thresholdsCredits ?? []).map(formatCredits).join(", ");
    const crossed = alerts?.crossedCredits ?? [];
    alertsState.textContent =
      (alerts?.thresholdsCredits.length ?? 0) === 0
        ? "No thresholds set."
        : crossed.length > 0
          ? `The available balance is below ${crossed.map(formatCredits).join(" and ")} credits.`
          : "The available balance is above every threshold.";
    urls.clear();
    for (const e of endpoints) urls.set(e.id, e.url);
    endpointsTable.tBodies[0]!.replaceChildren(...(endpoints.length > 0 ? endpoints.map(endpointRow) : [emptyRow(endpointsTable, "No endpoints yet.")]));
    await loadDeliveries();
  }

  return {
    load,
    clear() {
      hideSecret();
      thresholds.value = "";
      alertsState.textContent = "";
      alertsError.textContent = "";
      endpointsError.textContent = "";
      endpointsTable.tBodies[0]!.replaceChildren();
      deliveriesTable.tBodies[0]!.replaceChildren();
      urls.clear();
    },
  };
}
