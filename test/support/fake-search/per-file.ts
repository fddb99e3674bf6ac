import { afterAll, beforeAll, beforeEach } from "vitest";
import { startFakeSearch, type FakeSearch } from "./providers.js";

/**
 * The fake providers for one test file: started once, reset to their default
 * answers before each test, closed at the end. Read `fakes.current` inside tests.
 */
export function useFakeSearch(now: () => number): { current: FakeSearch } {
  const fakes = {} as { current: FakeSearch };
  beforeAll(async () => {
    fakes.current = await startFakeSearch({ now });
  });
  afterAll(async () => {
    await fakes.current?.close();
  });
  beforeEach(() => fakes.current.reset());
  return fakes;
}
