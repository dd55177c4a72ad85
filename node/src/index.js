/**
 * media_hooks for Node.js: emit deliveries inside your own `pg` transaction, and run the
 * delivery worker. The state machine is the database's (sql/queries, sql/migrations): both
 * this package and the Python engine run the same statements.
 */

export { UserError, RuntimeFailure } from './errors.js';
export { emit, emitEvent, emitMany, deriveDeliveryId, eventDeliveryId } from './emit.js';
export { sign, verify, decodeSecret, InvalidSecret, VerificationError } from './signing.js';
export { classifyResponse, classifyFailure, parseRetryAfter, OUTCOMES } from './outcomes.js';
export { refusal, checkAddress, guardedLookup, ForbiddenAddress } from './ssrf.js';
export { settingsFromEnv } from './config.js';
export { deliverDestinations, DeliveryCounts } from './worker.js';
export { openPipes, encodeParam, decodeParam } from './pipes.js';
