/**
 * Named crash points for the failure-boundary tests (media_hooks/core/crashpoints.py): with
 * MEDIA_HOOKS_CRASH_AT=<point> the process dies on the spot (no cleanup, no commit) the first
 * time it reaches that point; MEDIA_HOOKS_CRASH_AFTER=N lets it pass N times first.
 */

export const BEFORE_CLAIM_COMMIT = 'before_claim_commit';
export const AFTER_OUTBOX_COMMIT = 'after_outbox_commit';
export const AFTER_LEASE_BEFORE_REQUEST = 'after_lease_before_request';
export const AFTER_RECEIVER_ACCEPTED = 'after_receiver_accepted';
export const AFTER_RESPONSE_BEFORE_RECORD = 'after_response_before_record';
export const CRASH_EXIT_STATUS = 86;

let armed;
let passesLeft = 0;

/**
 * Die here if this point is armed.
 * @param {string} point
 */
export function hit(point) {
  if (armed === undefined) {
    armed = process.env.MEDIA_HOOKS_CRASH_AT ?? null;
    passesLeft = Number(process.env.MEDIA_HOOKS_CRASH_AFTER || 0);
  }
  if (armed !== point) return;
  if (passesLeft > 0) {
    passesLeft -= 1;
    return;
  }
  process.stderr.write(`media-hooks-node: crash point ${point} reached: exiting\n`);
  process.exit(CRASH_EXIT_STATUS);
}
