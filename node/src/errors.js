/**
 * The two kinds of failure a user sees (as media_hooks/core/errors.py): bad input, and the
 * environment failing. The command line exits 2 for the first and 1 for the second, with one
 * line on stderr.
 */

/** Bad usage or invalid input: one clear line, nothing written. */
export class UserError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'UserError';
    this.exitCode = 2;
  }
}

/** The environment failed (database unreachable, schema missing, ...). */
export class RuntimeFailure extends Error {
  /** @param {string} message @param {{cause?: unknown}} [options] */
  constructor(message, options) {
    super(message, options);
    this.name = 'RuntimeFailure';
    this.exitCode = 1;
  }
}

/**
 * An error's first line (a driver's message can run to a hint and a context), or its name.
 * @param {unknown} error
 * @returns {string}
 */
export function firstLine(error) {
  const text = error instanceof Error ? error.message : String(error);
  const line = text.trim().split('\n')[0];
  return line || (error instanceof Error ? error.name : 'Error');
}
