/** A mistake in the command line: exit code 2 and the message alone on stderr. */
export class UsageError extends Error {}
