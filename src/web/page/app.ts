/**
 * The account page: one HTML document whose views (sign in, accept an
 * invite, overview, keys, usage, activity) are sections shown one at a time.
 * It talks to the service only through the generated AccountService client;
 * the session is an HttpOnly cookie the page cannot read, and it never stores
 * an API key anywhere (a new key's secret lives in the DOM until dismissed).
 */
import type { ApiKey, GetAccountResponse, Member } from "../../gen/typesafe/account/v1/account_service_pb.js";
import { createActivityView } from "./activity-view.js";
import { createAccountClient, errorText, isSignedOut, listAllKeys } from "./client.js";
import { byId, keyLabel } from "./dom.js";
import { createKeysView } from "./keys-view.js";
import { loadOverview, showAccount } from "./overview-view.js";
import { createSecurityView } from "./security-view.js";
import { createTeamView } from "./team-view.js";
import { createUsageView } from "./usage-view.js";
import { createAlertsView } from "./alerts-view.js";
import { createEvaluationsView } from "./evaluations-view.js";

type SignedInView = "overview" | "keys" | "usage" | "alerts" | "evaluations" | "activity" | "team" | "security";
type View = "loading" | "sign-in" | "second-step" | "invite" | SignedInView;
const SIGNED_IN_VIEWS: SignedInView[] = ["overview", "keys", "usage", "alerts", "evaluations", "activity", "team", "security"];
const ALL_VIEWS: View[] = ["loading", "sign-in", "second-step", "invite", ...SIGNED_IN_VIEWS];
const MIN_PASSWORD_CHARS = 12;

const client = createAccountClient(location.origin);
const status = byId("status", HTMLElement);
const nav = byId("nav", HTMLElement);
const who = byId("who", HTMLElement);
const keyNames = new Map<string, string>();
let signedIn = false;
/** The signed-in member as GetAccount last read them, and whether the account requires a second factor. */
let me: Member | undefined;
let twoFactorRequired = false;
/** The token of a sign-in whose password passed and whose second step is due; held only in memory. */
let secondStepToken = "";

const keysView = createKeysView({ client, fail, onKeys: rememberKeys });
const usageView = createUsageView({ client, fail, keyName: (id) => keyNames.get(id) });
const activityView = createActivityView({ client, fail });
const teamView = createTeamView({ client, fail, me: () => me });
const securityView = createSecurityView({
  client,
  fail,
  refresh: async () => {
    enterSignedIn(await client.getAccount({}));
    return { member: me, twoFactorRequired };
  },
});
const alertsView = createAlertsView({ client, fail, onAccount: showAccount });
const evaluationsView = createEvaluationsView({ client, fail });

/** Shows one view, marks its nav link, and moves focus to its heading when the reader asked for it. */
function show(view: View, focus: boolean): void {
  for (const name of ALL_VIEWS) byId(`view-${name}`, HTMLElement).hidden = name !== view;
  for (const link of nav.querySelectorAll("a")) {
    if (link.hash === `#${view}`) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `${byId(`view-${view}`, HTMLElement).querySelector("h1")?.textContent ?? "Account"} · typesafe account`;
  if (focus) byId(`view-${view}`, HTMLElement).querySelector<HTMLElement>("h1")?.focus();
}

/** A failure in a view: a message beside it, or back to sign-in when the session is gone. */
function fail(err: unknown, where: HTMLElement): void {
  if (isSignedOut(err)) return toSignIn("Your session has ended. Please sign in again.");
  where.textContent = errorText(err);
}

function rememberKeys(keys: ApiKey[]): void {
  keyNames.clear();
  for (const key of keys) keyNames.set(key.id, key.name ? `${key.name} (${keyLabel(key.prefix, key.last4)})` : keyLabel(key.prefix, key.last4));
}

/** The signed-in view named by the URL's fragment (#keys), the overview by default. */
function currentView(): SignedInView {
  // A member the account's rule holds back sees only where to set up their second factor.
  if (twoFactorRequired && me?.twoFactorEnabled !== true) return "security";
  const name = location.hash.slice(1);
  return (SIGNED_IN_VIEWS as string[]).includes(name) ? (name as SignedInView) : "overview";
}

/** Opens the signed-in view the fragment names and loads its data; the section is aria-busy while it loads. */
async function route(focus: boolean): Promise<void> {
  if (!signedIn) return;
  const view = currentView();
  show(view, focus);
  const section = byId(`view-${view}`, HTMLElement);
  section.setAttribute("aria-busy", "true");
  try {
    if (view === "overview") await loadOverview(client);
    if (view === "keys") await keysView.load();
    if (view === "usage") {
      if (keyNames.size === 0) rememberKeys(await listAllKeys(client));
      await usageView.load();
    }
    if (view === "alerts") await alertsView.load();
    if (view === "evaluations") await evaluationsView.load();
    if (view === "activity") await activityView.load();
    if (view === "team") await teamView.load();
    if (view === "security") await securityView.load();
  } catch (err) {
    fail(err, status);
  } finally {
    section.setAttribute("aria-busy", "false");
  }
}

function enterSignedIn(response: GetAccountResponse): void {
  signedIn = true;
  nav.hidden = false;
  who.hidden = false;
  me = response.member;
  twoFactorRequired = response.account?.twoFactorRequired === true;
  byId("who-email", HTMLElement).textContent = response.member?.email ?? "";
  byId("who-role", HTMLElement).textContent = response.member?.role ?? "";
  if (response.account) showAccount(response.account);
}

/** Reads the session: signed in shows the fragment's view, no session shows sign-in. */
async function resume(focus: boolean): Promise<void> {
  try {
    enterSignedIn(await client.getAccount({}));
  } catch (err) {
    if (isSignedOut(err)) return toSignIn("");
    show("sign-in", false);
    status.textContent = errorText(err);
    return;
  }
  await route(focus);
}

/** Forgets everything shown for the last member (the new key's secret first) and shows sign-in. */
function toSignIn(message: string): void {
  signedIn = false;
  keysView.clear();
  usageView.clear();
  activityView.clear();
  teamView.clear();
  securityView.clear();
  alertsView.clear();
  evaluationsView.clear();
  byId("low-balance", HTMLElement).hidden = true;
  keyNames.clear();
  me = undefined;
  twoFactorRequired = false;
  secondStepToken = "";
  nav.hidden = true;
  who.hidden = true;
  byId("who-email", HTMLElement).textContent = "";
  byId("who-role", HTMLElement).textContent = "";
  byId("sign-in-password", HTMLInputElement).value = "";
  status.textContent = message;
  show("sign-in", true);
}

function invalid(input: HTMLInputElement, error: HTMLElement, message: string): void {
  input.setAttribute("aria-invalid", "true");
  error.textContent = message;
  input.focus();
}

byId("sign-in-form", HTMLFormElement).addEventListener("submit", (event) => {
  event.preventDefault();
  const email = byId("sign-in-email", HTMLInputElement);
  const password = byId("sign-in-password", HTMLInputElement);
  const error = byId("sign-in-error", HTMLElement);
  error.textContent = "";
  if (!email.value.trim()) return invalid(email, error, "Enter your email.");
  if (!password.value) return invalid(password, error, "Enter your password.");
  email.removeAttribute("aria-invalid");
  password.removeAttribute("aria-invalid");
  void client
    .signIn({ email: email.value.trim(), password: password.value })
    .then(async (answer) => {
      password.value = "";
      status.textContent = "";
      if (answer.secondStepToken) {
        secondStepToken = answer.secondStepToken;
        show("second-step", false);
        byId("second-step-code", HTMLInputElement).focus();
        return;
      }
      await resume(true);
    })
    .catch((err: unknown) => {
      password.value = "";
      error.textContent = errorText(err);
      password.focus();
    });
});

byId("second-step-form", HTMLFormElement).addEventListener("submit", (event) => {
  event.preventDefault();
  const code = byId("second-step-code", HTMLInputElement);
  const recoveryCode = byId("second-step-recovery", HTMLInputElement);
  const error = byId("second-step-error", HTMLElement);
  error.textContent = "";
  if (!code.value.trim() && !recoveryCode.value.trim()) return invalid(code, error, "Enter the code of your app, or a recovery code.");
  const answer = code.value.trim() ? { code: code.value.trim() } : { recoveryCode: recoveryCode.value.trim() };
  void client
    .signInSecondStep({ secondStepToken, ...answer })
    .then(async () => {
      code.value = recoveryCode.value = "";
      secondStepToken = "";
      await resume(true);
    })
    .catch((err: unknown) => {
      code.value = recoveryCode.value = "";
      error.textContent = errorText(err);
      code.focus();
    });
});

byId("invite-form", HTMLFormElement).addEventListener("submit", (event) => {
  event.preventDefault();
  const password = byId("invite-password", HTMLInputElement);
  const again = byId("invite-password-again", HTMLInputElement);
  const error = byId("invite-error", HTMLElement);
  error.textContent = "";
  password.removeAttribute("aria-invalid");
  again.removeAttribute("aria-invalid");
  // Counted as the service counts: code points of the NFC form.
  if ([...password.value.normalize("NFC")].length < MIN_PASSWORD_CHARS) return invalid(password, error, `The password needs at least ${MIN_PASSWORD_CHARS} characters.`);
  if (again.value !== password.value) return invalid(again, error, "The two passwords differ.");
  const inviteToken = new URLSearchParams(location.search).get("invite") ?? "";
  void client
    .acceptInvite({ inviteToken, password: password.value })
    .then(async () => {
      password.value = again.value = "";
      // The token is spent: take it out of the address bar and the history.
      history.replaceState(null, "", `${location.pathname}#overview`);
      status.textContent = "Welcome: your password is set and you are signed in.";
      await resume(true);
    })
    .catch((err: unknown) => {
      error.textContent = errorText(err);
    });
});

byId("sign-out", HTMLButtonElement).addEventListener("click", () => {
  void client.signOut({}).then(
    () => toSignIn("You are signed out."),
    (err: unknown) => {
      // A session that had already ended is as signed out as one just ended.
      if (isSignedOut(err)) toSignIn("You are signed out.");
      else status.textContent = errorText(err);
    },
  );
});

window.addEventListener("hashchange", () => {
  // A message belongs to the view it was said in.
  status.textContent = "";
  void route(true);
});

if (new URLSearchParams(location.search).has("invite")) show("invite", false);
else void resume(false);
