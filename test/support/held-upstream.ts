import { defaultHandler, deferred, isProbe, type FakeHandler, type FakeLlm, type FakeReply } from "./fake-llm.js";

/**
 * Makes the fake LLM answer its capability probe at once and hold every
 * question call open: `reply` gives the question's answer (the default
 * `yes` distribution unless given), which is sent once `release()` is
 * called. `reached` resolves when the first question arrives.
 */
export function holdQuestions(fake: FakeLlm, reply: FakeHandler = defaultHandler) {
  const released = deferred();
  const reached = deferred();
  fake.setHandler(async (request, index): Promise<FakeReply> => {
    if (isProbe(request.body)) return defaultHandler(request, index);
    reached.resolve();
    return { ...(await reply(request, index)), hold: released.promise };
  });
  return {
    reached: reached.promise,
    release() {
      released.resolve();
      fake.setHandler(defaultHandler);
    },
  };
}

/** Questions get `reply`; the probe is answered normally. */
export function answerQuestions(fake: FakeLlm, reply: FakeHandler): void {
  fake.setHandler((request, index) => (isProbe(request.body) ? defaultHandler(request, index) : reply(request, index)));
}
