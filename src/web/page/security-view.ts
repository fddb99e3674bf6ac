import qrcode from "qrcode-generator";
import type { Member } from "../../gen/typesafe/account/v1/account_service_pb.js";
import { errorText, type AccountClient } from "./client.js";
import { byId } from "./dom.js";

export interface SecurityViewOptions {
  client: AccountClient;
  fail(err: unknown, where: HTMLElement): void;
  /** Reads the signed-in member and the account again (after a change of their two-factor state). */
  refresh(): Promise<{ member?: Member; twoFactorRequired: boolean }>;
}

/**
 * The security view: the member's own two-factor sign-in (set up with a QR
 * code or the key as text, confirmed with a first code; recovery codes shown
 * once; turned off with a code), and for owners, the account's requirement.
 */
export function createSecurityView(options: SecurityViewOptions): { load(): Promise<void>; clear(): void } {
  const { client } = options;
  const error = byId("security-error", HTMLElement);
  const state = byId("two-factor-state", HTMLElement);
  const start = byId("enroll-start", HTMLButtonElement);
  const enroll = byId("enroll", HTMLElement);
  const recovery = byId("recovery", HTMLElement);
  const disable = byId("disable-form", HTMLFormElement);
  const requireBox = byId("require-box", HTMLElement);
  const require = byId("require-two-factor", HTMLInputElement);

  start.addEventListener("click", () => {
    error.textContent = "";
    void client
      .startTwoFactorEnrollment({})
      .then((started) => {
        byId("enroll-secret", HTMLElement).textContent = started.secret;
        byId("enroll-uri", HTMLElement).textContent = started.otpauthUri;
        byId("enroll-qr", HTMLElement).replaceChildren(qrSvg(started.otpauthUri));
        enroll.hidden = false;
        start.hidden = true;
        byId("enroll-code", HTMLInputElement).focus();
      })
      .catch((err: unknown) => options.fail(err, error));
  });

  byId("enroll-form", HTMLFormElement).addEventListener("submit", (event) => {
    event.preventDefault();
    error.textContent = "";
    const code = byId("enroll-code", HTMLInputElement);
    void client
      .confirmTwoFactorEnrollment({ code: code.value.trim() })
      .then(async ({ recoveryCodes }) => {
        code.value = "";
        forgetEnrollment();
        byId("recovery-codes", HTMLElement).replaceChildren(...recoveryCodes.map((c) => Object.assign(document.createElement("li"), { textContent: c })));
        recovery.hidden = false;
        recovery.focus();
        await load();
      })
      .catch((err: unknown) => options.fail(err, error));
  });

  byId("dismiss-recovery", HTMLButtonElement).addEventListener("click", () => {
    forgetRecoveryCodes();
    void load();
  });

  disable.addEventListener("submit", (event) => {
    event.preventDefault();
    error.textContent = "";
    const code = byId("disable-code", HTMLInputElement);
    void client
      .disableTwoFactor({ code: code.value.trim() })
      .then(() => {
        code.value = "";
        return load();
      })
      .catch((err: unknown) => {
        code.value = "";
        // A wrong code is answered as a failed second step (401): the session itself lives on.
        error.textContent = errorText(err);
      });
  });

  require.addEventListener("change", () => {
    error.textContent = "";
    void client
      .setTwoFactorRequired({ required: require.checked })
      .then(() => load())
      .catch((err: unknown) => {
        require.checked = !require.checked;
        options.fail(err, error);
      });
  });

  function forgetEnrollment(): void {
    byId("enroll-secret", HTMLElement).textContent = "";
    byId("enroll-uri", HTMLElement).textContent = "";
    byId("enroll-qr", HTMLElement).replaceChildren();
    enroll.hidden = true;
  }

  function forgetRecoveryCodes(): void {
    byId("recovery-codes", HTMLElement).replaceChildren();
    recovery.hidden = true;
  }

  async function load(): Promise<void> {
    const { member, twoFactorRequired } = await options.refresh();
    const on = member?.twoFactorEnabled === true;
    state.textContent = on
      ? "Two-factor sign-in is on: signing in asks for a code of your authenticator app."
      : twoFactorRequired
        ? "This account requires two-factor sign-in: set it up to use the account."
        : "Two-factor sign-in is off.";
    start.hidden = on || !enroll.hidden;
    disable.hidden = !on || twoFactorRequired;
    requireBox.hidden = member?.role !== "owner";
    require.checked = twoFactorRequired;
  }

  return {
    load,
    clear() {
      forgetEnrollment();
      forgetRecoveryCodes();
      error.textContent = "";
    },
  };
}

/** The otpauth URI as a QR code, drawn as SVG elements (no inline style or image data the page's policy would refuse). */
function qrSvg(text: string): SVGSVGElement {
  const qr = qrcode(0, "M");
  qr.addData(text);
  qr.make();
  const size = qr.getModuleCount();
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${size} ${size}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "QR code of the two-factor key");
  svg.setAttribute("shape-rendering", "crispEdges");
  let path = "";
  for (let r = 0; r < size; r++) for (let c = 0; c < size; c++) if (qr.isDark(r, c)) path += `M${c} ${r}h1v1h-1z`;
  const dark = document.createElementNS(ns, "path");
  dark.setAttribute("d", path);
  dark.setAttribute("fill", "#000");
  svg.append(dark);
  return svg;
}
