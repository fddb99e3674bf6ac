/**
 * The service origins whose gateway exchanges are held against the OpenAPI
 * document, kept apart from the checker (openapi-conformance.ts): the setup
 * file every test file loads needs only this, so a file that starts no service
 * does not pay for loading ajv, the document and the rules it checks against.
 * An origin is only ever registered through the checker's checkAnswersOf, so
 * a registered origin means the checker is loaded.
 */
export interface ExchangeChecker {
  isDocumentedPath(path: string): boolean;
  recordExchange(request: SentRequestLike, answer: { status: number; headers: Headers; body: string }): void;
  takeViolations(): string[];
}
type SentRequestLike = { method: string; url: string; headers: Headers; body: Buffer | undefined };

const serviceOrigins = new Set<string>();
let checker: ExchangeChecker | undefined;

/** Exchanges with this origin are checked from now on. */
export function addServiceOrigin(url: string): void {
  serviceOrigins.add(new URL(url).origin);
}

/** True when exchanges with this URL's origin are checked. */
export function isServiceUrl(url: string | URL): boolean {
  return serviceOrigins.has(new URL(url).origin);
}

/** Called once by the checker as it loads. */
export function installChecker(loaded: ExchangeChecker): void {
  checker = loaded;
}

/** The checker, once some module of this test file has loaded it. */
export function loadedChecker(): ExchangeChecker | undefined {
  return checker;
}

/** The checker for an exchange with a registered origin, which only the loaded checker registers. */
export function checkerFor(url: string | URL): ExchangeChecker | undefined {
  if (!isServiceUrl(url)) return undefined;
  if (!checker) throw new Error(`exchanges with ${new URL(url).origin} are to be checked, but the OpenAPI checker is not loaded`);
  return checker;
}
