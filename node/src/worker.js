/**
 * The Node.js delivery worker: one destination's due deliveries, from the claim to recorded
 * outcomes, through the same statements as the Python engine's production path
 * (media_hooks/engine/delivery.py: DuePages -> claim_destination_page -> lease_with_permits -> send ->
 * record), so the state machine is the database's and the same for both runtimes.
 *
 * For each page it claims, the worker takes permits from the destination's global limits and
 * leases as many deliveries as it got permits in one round trip (lease_with_permits), sends
 * each at the moment its start was granted for, and records what finished in batches
 * (record_classified_outcomes: the database decides the next state, the backoff, a pause, a
 * disabled destination). No transaction is open while a request is in flight, a worker waiting
 * for permits holds no lease, and an outcome waits at most RECORD_MAX_DELAY_SECONDS.
 *
 * A destination's failures are data: recorded and counted, never thrown. Only infrastructure
 * faults (the database, a bug) throw, and then whatever the worker holds is handed back first
 * (`settle`, as the Python worker's `_settle`): every request in flight is waited for and its
 * outcome recorded, a lease never sent is recorded as not started, and every permit is
 * returned. A statement that meets a lock or a timeout is retried (db.retrying).
 */

import * as crashpoints from './crashpoints.js';
import { connect, requireCurrent, retrying, run } from './db.js';
import { UserError } from './errors.js';
import { outOfRange } from './config.js';
import { RATE_LIMITED, RETRYABLE } from './outcomes.js';
import { openSecret } from './secrets.js';
import { Sender } from './sender.js';
import { InvalidSecret } from './signing.js';

// Margin a lease keeps beyond the longest a send can take, for recording the outcome.
export const LEASE_MARGIN_SECONDS = 2.0;
export const DEFAULT_MAX_WAIT_SECONDS = 60.0;
export const DEFAULT_PAGE_SIZE = 500;
const RECORD_BATCH = 100;
const RECORD_MAX_DELAY_SECONDS = 0.2;
const GATHER_SECONDS = 0.002;
const REFRESH_SECONDS = 5.0;
const RECORD_DEADLINE_MARGIN_SECONDS = 5.0;
// The limiter's polls and how far ahead a start may be granted (media_hooks/outbox/rate_limits.py).
const SLOT_POLL_SECONDS = 0.02;
const DISABLED_POLL_SECONDS = 1.0;
const AHEAD_SECONDS = 0.05;

const now = () => performance.now() / 1000;
const COUNT_NAMES = [
  'attempted',
  'succeeded',
  'retried',
  'rate_limited',
  'ambiguous',
  'dead',
  'skipped',
  'deferred',
  'guard_refused',
];

/** What a destination's worker did, in the Python engine's names (DeliveryCounts). */
export class DeliveryCounts {
  constructor() {
    for (const name of COUNT_NAMES) this[name] = 0;
  }

  /**
   * One recorded attempt, by its outcome and the state it left the delivery in.
   * @param {string} outcome
   * @param {string} state
   */
  count(outcome, state) {
    this.attempted += 1;
    if (state === 'succeeded') this.succeeded += 1;
    else if (state === 'dead') this.dead += 1;
    else if (outcome === RATE_LIMITED) this.rate_limited += 1;
    else this.retried += 1;
    if (outcome === 'ambiguous') this.ambiguous += 1;
  }

  /** An attempt that does not count against its delivery: nothing was sent.
   * @param {boolean} configurationFault */
  countSpared(configurationFault) {
    if (configurationFault) this.guard_refused += 1;
    else this.deferred += 1;
  }

  toJSON() {
    return Object.fromEntries(COUNT_NAMES.map((name) => [name, this[name]]));
  }
}

/** Outcomes the database would not record (not a passing lock or timeout): retrying would
 * not record them; their leases expire and the deliveries are due again as ambiguous. */
export class OutcomesNotRecorded extends Error {
  /** @param {string[]} deliveryIds @param {unknown} cause */
  constructor(deliveryIds, cause) {
    const shown = deliveryIds.slice(0, 5).join(', ') + (deliveryIds.length > 5 ? ', ...' : '');
    const first = (cause instanceof Error ? cause.message : String(cause)).trim().split('\n')[0];
    super(
      `could not record the outcomes of ${deliveryIds.length} attempt(s) (${shown}): ${first}; ` +
        'they stay leased until their leases end, then are due again as ambiguous',
      { cause },
    );
    this.name = 'OutcomesNotRecorded';
  }
}

/**
 * Answers of requests in flight, as they finish; a wait for them also ends on a timeout or
 * when the worker is stopped.
 */
class Inbox {
  constructor() {
    this.items = [];
    this.waiter = null;
  }

  /** @param {any} item */
  push(item) {
    this.items.push(item);
    this.waiter?.();
  }

  /**
   * Everything that has arrived, waiting up to `seconds` for the first (null: no bound).
   * @param {number | null} seconds
   * @param {AbortSignal | null} signal wakes the wait when it aborts
   */
  async take(seconds, signal) {
    if (!this.items.length && seconds !== 0 && !signal?.aborted) {
      await new Promise((resolve) => {
        const wake = () => {
          clearTimeout(timer);
          signal?.removeEventListener('abort', wake);
          this.waiter = null;
          resolve();
        };
        const timer = seconds === null ? null : setTimeout(wake, Math.max(seconds * 1000, 0));
        signal?.addEventListener('abort', wake);
        this.waiter = wake;
      });
    }
    return this.items.splice(0);
  }
}

/**
 * Sleep `seconds`, or less when `signal` aborts; true if it aborted.
 * @param {number} seconds
 * @param {AbortSignal} signal
 */
function stopWait(seconds, signal) {
  if (signal.aborted) return Promise.resolve(true);
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve(signal.aborted);
    };
    const timer = setTimeout(done, Math.max(seconds * 1000, 0));
    signal.addEventListener('abort', done);
  });
}

/**
 * The database's clock on this process's monotonic clock (rate_limits.DatabaseClock): every
 * answer bounds the offset; the least of the recent ones is the closest, so a start granted
 * for a moment is never sent before it.
 */
export class DatabaseClock {
  static WINDOW_SECONDS = 10.0;
  static CALIBRATION_ROUNDS = 5;

  constructor() {
    /** @type {[number, number][]} (arrival, offset), offsets rising */
    this.offsets = [];
  }

  /** @param {number} databaseTime Unix seconds @param {number} arrived seconds, performance.now() */
  observe(databaseTime, arrived) {
    const offset = arrived - databaseTime;
    while (this.offsets.length && this.offsets.at(-1)[1] >= offset) this.offsets.pop();
    this.offsets.push([arrived, offset]);
    while (this.offsets[0][0] < arrived - DatabaseClock.WINDOW_SECONDS) this.offsets.shift();
  }

  /** @param {import('pg').Client} client */
  async calibrate(client) {
    for (let i = 0; i < DatabaseClock.CALIBRATION_ROUNDS; i += 1) {
      const [{ now: databaseTime }] = await run(client, 'database_clock');
      this.observe(databaseTime, now());
    }
  }

  /** @param {number} databaseTime Unix seconds */
  monotonicAt(databaseTime) {
    return databaseTime + this.offsets[0][1];
  }
}

/**
 * The most rows a run claims, shared by its destinations' workers (null: no cap). A claim
 * reserves up to a page before it runs and settles afterwards; a worker finding the budget
 * spent waits while claims are still reserving rows (one may hand rows back).
 */
export class RowBudget {
  /** @param {number | null} rows */
  constructor(rows) {
    this.left = rows;
    this.reserved = 0;
    this.waiters = [];
  }

  /** @param {number} wanted */
  async take(wanted) {
    if (this.left === null) return wanted;
    while (!(this.left > 0 || this.reserved === 0)) {
      await new Promise((resolve) => this.waiters.push(resolve));
    }
    const granted = Math.min(wanted, this.left);
    this.left -= granted;
    this.reserved += granted;
    return granted;
  }

  /** @param {number} reserved @param {number} claimed */
  settle(reserved, claimed) {
    if (this.left === null) return;
    this.reserved -= reserved;
    this.left += reserved - claimed;
    for (const wake of this.waiters.splice(0)) wake();
  }
}

/**
 * One destination's due deliveries, claimed a page at a time as its worker runs out
 * (claim_destination_page, which publishes what it claims). Claiming stops at the first page that
 * comes back short, when the run's row budget is spent, or when the worker stops.
 */
export class DuePages {
  /**
   * @param {string} runId
   * @param {string} destinationId
   * @param {number} pageSize
   * @param {RowBudget} budget
   * @param {{log?: (line: string) => void}} [options]
   */
  constructor(runId, destinationId, pageSize, budget, { log } = {}) {
    Object.assign(this, { runId, destinationId, pageSize, budget, log });
    this.claimed = 0;
    this.done = false;
  }

  /** @param {import('pg').Client} client @returns {Promise<{message_id: string, delivery_id: string}[]>} */
  async nextPage(client) {
    if (this.done) return [];
    const size = await this.budget.take(this.pageSize);
    if (size === 0) {
      this.done = true;
      return [];
    }
    let page = [];
    try {
      page = await retrying('claim a page', () => this.#claim(client, size), { log: this.log });
    } finally {
      this.budget.settle(size, page.length);
    }
    crashpoints.hit(crashpoints.AFTER_OUTBOX_COMMIT);
    this.claimed += page.length;
    this.done = page.length < size;
    return page;
  }

  /** @param {import('pg').Client} client @param {number} size */
  async #claim(client, size) {
    await client.query('BEGIN');
    try {
      await run(client, 'plan_by_index');
      const rows = await run(client, 'claim_destination_page', {
        run_id: this.runId,
        destination_id: this.destinationId,
        page_size: size,
        destination_ids: [this.destinationId],
        event_types: [],
        asset_ids: [],
        created_after: null,
        created_before: null,
      });
      crashpoints.hit(crashpoints.BEFORE_CLAIM_COMMIT);
      await client.query('COMMIT');
      return rows;
    } catch (error) {
      await client.query('ROLLBACK').catch(() => {});
      throw error;
    }
  }

  stop() {
    this.done = true;
  }
}

/**
 * @typedef {object} Lease
 * @property {string} deliveryId
 * @property {string} messageId
 * @property {string} leaseToken
 * @property {number} attemptNo
 * @property {Buffer} body
 *
 * @typedef {object} Grant
 * @property {number[]} slots
 * @property {number[]} startAt Unix seconds, on the database's clock
 * @property {number} retryIn
 * @property {string | null} reason
 * @property {number | null} answeredAt
 */

/** @returns {Grant} */
const emptyGrant = (retryIn = 0) => ({ slots: [], startAt: [], retryIn, reason: null, answeredAt: null });

/**
 * A classified outcome as record_classified_outcomes takes it (leases.Classified).
 * @param {Lease} lease
 * @param {import('./sender.js').AttemptResult} result
 */
function classified(lease, result) {
  return {
    lease,
    outcome: result.outcome,
    httpStatus: result.httpStatus,
    retryAfterSeconds: result.retryAfterSeconds,
    error: result.error,
    excerpt: result.responseExcerpt,
    finishedMonotonic: result.finishedMonotonic,
    attempted: true,
    configurationFault: result.configurationFault,
  };
}

/**
 * A lease whose request was never started (the worker stopped between lease and send).
 * @param {Lease} lease
 * @param {unknown} why
 */
function notSent(lease, why) {
  const name = why instanceof Error ? why.name : 'Error';
  const text = why instanceof Error ? why.message : String(why ?? 'stopped');
  return {
    lease,
    outcome: RETRYABLE,
    httpStatus: null,
    retryAfterSeconds: null,
    error: `not sent: the worker stopped first (${name}: ${text})`.slice(0, 500),
    excerpt: null,
    finishedMonotonic: now(),
    attempted: false,
    configurationFault: false,
  };
}

/**
 * Record classified outcomes; the database decides every next state.
 * @param {import('pg').Client} client
 * @param {ReturnType<typeof classified>[]} outcomes
 */
async function recordClassified(client, outcomes) {
  const at = now();
  const document = outcomes.map((o) => ({
    delivery_id: o.lease.deliveryId,
    lease_token: o.lease.leaseToken,
    outcome: o.outcome,
    http_status: o.httpStatus,
    retry_after: o.retryAfterSeconds,
    error: o.error,
    excerpt: o.excerpt,
    finished_ago: at - o.finishedMonotonic,
    attempted: o.attempted,
    configuration_fault: o.configurationFault,
  }));
  const rows = await run(client, 'record_classified_outcomes', { outcomes: JSON.stringify(document) });
  return {
    states: new Map(rows.filter((r) => r.state !== null).map((r) => [r.delivery_id, r.state])),
    stopped: rows.find((r) => r.stopped !== null)?.stopped ?? null,
  };
}

/** Whether a sender built for `before` still sends as `after` says.
 * @param {Record<string, any>} before @param {Record<string, any>} after */
function sameSending(before, after) {
  return (
    before.url === after.url &&
    before.timeout_seconds === after.timeout_seconds &&
    before.max_in_flight === after.max_in_flight &&
    before.allow_private_url === after.allow_private_url &&
    JSON.stringify(before.secrets) === JSON.stringify(after.secrets)
  );
}

export class DestinationWorker {
  /**
   * @param {{client: import('pg').Client, runId: string, pages: DuePages,
   *   settings: import('./config.js').Settings, maxWaitSeconds: number, signal: AbortSignal,
   *   log: (line: string) => void}} options
   */
  constructor({ client, runId, pages, settings, maxWaitSeconds, signal, log }) {
    Object.assign(this, { client, runId, pages, settings, maxWaitSeconds, signal, log });
    this.destinationId = pages.destinationId;
    // Every worker of a run holds its permits under the run's id (as the Python engine does),
    // so the run's failure handling can free them at once.
    this.holder = runId;
    this.counts = new DeliveryCounts();
    this.destination = null;
    this.sender = null;
    this.retired = [];
    this.leaseSeconds = settings.leaseSeconds;
    this.refreshedAt = -Infinity;
    /** @type {{message_id: string, delivery_id: string}[]} */
    this.waiting = [];
    this.pagesExhausted = false;
    /** @type {[Lease, number, number][]} leases not yet sent: slot, start (monotonic) */
    this.unsent = [];
    /** @type {Map<string, [Lease, number]>} */
    this.inFlight = new Map();
    /** @type {Map<string, number>} */
    this.leaseEnds = new Map();
    this.answers = new Inbox();
    /** @type {[ReturnType<typeof classified>, import('./sender.js').AttemptResult | null][]} */
    this.finished = [];
    /** @type {number[]} */
    this.returnedSlots = [];
    this.clock = new DatabaseClock();
    this.waitStarted = null;
    this.grant = emptyGrant();
    this.nextAskAt = 0;
    this.recordRefused = false;
    /** @type {string | null} why this worker sends nothing more (it disabled its destination) */
    this.stopped = null;
  }

  /**
   * @template T
   * @param {string} what
   * @param {(client: import('pg').Client) => Promise<T>} action
   */
  db(what, action) {
    return retrying(what, () => action(this.client), { log: this.log });
  }

  // The destination -------------------------------------------------------------------------

  async refreshDestination() {
    const rows = await this.db('read destination', (c) =>
      run(c, 'destination_get', { destination_id: this.destinationId }),
    );
    if (!rows.length) throw new UserError(`no destination '${this.destinationId}'`);
    const owner = `destination '${this.destinationId}'`;
    const current = {
      ...rows[0],
      secrets: rows[0].secrets.map((s) => openSecret(s, this.settings.secretKeys, owner)),
    };
    this.refreshedAt = now();
    const previous = this.destination;
    this.destination = current;
    const problem = outOfRange(current);
    if (problem !== null) {
      await this.disable(problem);
      return;
    }
    if (this.stopped !== null) return;
    if (previous !== null && this.sender !== null && sameSending(previous, current)) return;
    let sender;
    try {
      sender = new Sender({
        url: current.url,
        secrets: current.secrets,
        timeoutSeconds: current.timeout_seconds,
        // The deployment's setting opens every destination; the destination's own flag
        // (destination add --allow-private-url, migration 0018) opens it alone.
        allowPrivate: this.settings.allowPrivateUrls || current.allow_private_url === true,
        maxInFlight: current.max_in_flight,
      });
    } catch (error) {
      if (!(error instanceof InvalidSecret)) throw error;
      await this.disable(`configuration: a stored secret is unusable (${error.message})`);
      return;
    }
    if (this.sender !== null) this.retired.push(this.sender);
    this.sender = sender;
    this.leaseSeconds = Math.max(
      this.settings.leaseSeconds,
      sender.worstCaseSeconds + LEASE_MARGIN_SECONDS,
    );
  }

  /** The destination stops for every worker until an operator enables it.
   * @param {string} reason */
  async disable(reason) {
    if (this.destination?.enabled) {
      this.log(`disabling destination ${this.destinationId}: ${reason}`);
      await this.db('disable destination', (c) =>
        run(c, 'destination_disable', { destination_id: this.destinationId, reason }),
      );
    }
    this.stopped = reason;
  }

  // Pages -----------------------------------------------------------------------------------

  async refill() {
    if (this.waiting.length || this.pagesExhausted) return;
    const page = await this.pages.nextPage(this.client);
    if (page.length) {
      await this.refreshDestination();
      this.waiting.push(...page);
    } else {
      this.pagesExhausted = true;
    }
  }

  // Sending ---------------------------------------------------------------------------------

  /** Take permits and lease that many waiting messages (one round trip), and send them.
   * @returns {Promise<[Grant, number]>} the grant and how many waiting messages it used up */
  async step() {
    const free = this.destination.max_in_flight - this.inFlight.size;
    const offered = this.waiting.slice(0, Math.max(Math.min(free, this.waiting.length), 0));
    if (!offered.length) return [emptyGrant(), 0];
    const returned = this.returnedSlots;
    this.returnedSlots = [];
    let rows;
    try {
      rows = await this.db('lease with permits', (c) =>
        run(c, 'lease_with_permits', {
          destination_id: this.destinationId,
          holder: this.holder,
          hold_seconds: this.leaseSeconds,
          slot_poll_seconds: SLOT_POLL_SECONDS,
          disabled_poll_seconds: DISABLED_POLL_SECONDS,
          ahead_seconds: AHEAD_SECONDS,
          release_slots: returned,
          run_id: this.runId,
          delivery_ids: offered.map((m) => m.delivery_id),
          message_ids: offered.map((m) => m.message_id),
        }),
      );
    } catch (error) {
      this.returnedSlots = [...returned, ...this.returnedSlots]; // not handed back after all
      throw error;
    }
    const answered = now();
    const first = rows[0];
    const leased = rows.filter((r) => r.delivery_id !== null);
    /** @type {Grant} */
    const grant = {
      slots: leased.map((r) => r.slot),
      startAt: leased.map((r) => r.start_at),
      retryIn: Number(first.retry_in),
      reason: first.reason,
      answeredAt: first.answered_at,
    };
    this.waiting.splice(0, first.examined);
    this.counts.skipped += first.examined - leased.length;
    this.grant = grant;
    this.nextAskAt = answered + this.askDelay(grant);
    this.clock.observe(grant.answeredAt, answered);
    const ends = answered + this.leaseSeconds;
    this.unsent = leased.map((r) => [
      {
        deliveryId: r.delivery_id,
        messageId: r.message_id,
        leaseToken: r.lease_token,
        attemptNo: r.attempt_no,
        body: r.body,
      },
      r.slot,
      this.clock.monotonicAt(r.start_at),
    ]);
    for (const [lease] of this.unsent) this.leaseEnds.set(lease.deliveryId, ends);
    if (this.unsent.length) crashpoints.hit(crashpoints.AFTER_LEASE_BEFORE_REQUEST);
    while (this.unsent.length) {
      const [lease, slot, startAt] = this.unsent[0];
      if ((await this.waitForStart(startAt)) || this.stopped !== null) break;
      this.inFlight.set(lease.deliveryId, [lease, slot]);
      this.sender.send(lease.deliveryId, lease.body).then((result) =>
        this.answers.push([lease.deliveryId, result]),
      );
      this.unsent.shift();
    }
    return [grant, first.examined];
  }

  /** Wait until `startAt` (monotonic seconds), taking and recording meanwhile whatever
   * finishes or falls due; true if the worker was stopped first.
   * @param {number} startAt */
  async waitForStart(startAt) {
    let left;
    while ((left = startAt - now()) > 0) {
      const bound = this.waitBound(emptyGrant());
      const timeout = bound === null ? left : Math.min(left, bound);
      if (this.inFlight.size) await this.collect(timeout);
      else if (await stopWait(timeout, this.signal)) return true;
      else if (this.recordDue()) await this.record();
    }
    return this.signal.aborted;
  }

  /** @param {string} deliveryId @param {import('./sender.js').AttemptResult} result */
  take(deliveryId, result) {
    const [lease, slot] = this.inFlight.get(deliveryId);
    this.inFlight.delete(deliveryId);
    this.finished.push([classified(lease, result), result]);
    this.returnedSlots.push(slot);
  }

  /** Wait for at least one request to finish (or `timeout`) and take what finished.
   * @param {number | null} timeout */
  async collect(timeout) {
    const done = await this.answers.take(timeout, this.signal);
    if (done.length && done.length < this.inFlight.size) {
      // Requests sent together tend to finish together: a moment's wait for the rest lets the
      // next ask take several permits in one round trip.
      done.push(...(await this.answers.take(GATHER_SECONDS, null)));
    }
    for (const [deliveryId, result] of done) this.take(deliveryId, result);
    if (done.length && this.grant.reason === 'in flight') this.nextAskAt = 0;
    if (this.recordDue()) await this.record();
  }

  oldestUnrecorded() {
    return Math.min(...this.finished.map(([o]) => o.finishedMonotonic));
  }

  recordDue() {
    if (!this.finished.length) return false;
    const idle = !this.inFlight.size && !this.waiting.length && this.pagesExhausted;
    if (idle || this.finished.length >= RECORD_BATCH) return true;
    // A destination's signal (429, 410, a refused address) acts at once.
    const signal = this.finished.some(
      ([, r]) => r !== null && (r.outcome === RATE_LIMITED || r.httpStatus === 410 || r.configurationFault),
    );
    return signal || now() - this.oldestUnrecorded() >= RECORD_MAX_DELAY_SECONDS;
  }

  /** How long after this answer the next ask is worth its round trip (delivery._ask_delay).
   * @param {Grant} grant */
  askDelay(grant) {
    if (grant.reason !== 'rate' || this.destination === null) return grant.reason ? grant.retryIn : 0;
    const together = Math.max(Math.min(this.destination.burst, this.waiting.length), 1);
    return grant.retryIn + (together - 1) / this.destination.rate_per_second;
  }

  /** How long to wait for a request to finish (null: no bound).
   * @param {Grant} grant */
  waitBound(grant) {
    const bounds = [];
    if (this.waiting.length && grant.reason) bounds.push(Math.max(this.nextAskAt - now(), 0));
    if (this.finished.length) {
      bounds.push(Math.max(this.oldestUnrecorded() + RECORD_MAX_DELAY_SECONDS - now(), 0));
    }
    return bounds.length ? Math.min(...bounds) : null;
  }

  async record() {
    crashpoints.hit(crashpoints.AFTER_RESPONSE_BEFORE_RECORD);
    const finished = this.finished;
    const batch = finished.map(([o]) => o);
    const deadline =
      (Math.min(...batch.map((o) => this.leaseEnds.get(o.lease.deliveryId))) -
        RECORD_DEADLINE_MARGIN_SECONDS) *
      1000;
    let recorded;
    try {
      recorded = await retrying('record outcomes', () => recordClassified(this.client, batch), {
        until: deadline,
        log: this.log,
      });
    } catch (error) {
      this.recordRefused = true;
      throw new OutcomesNotRecorded(batch.map((o) => o.lease.deliveryId), error);
    }
    this.finished = [];
    for (const [outcome] of finished) {
      this.leaseEnds.delete(outcome.lease.deliveryId);
      const state = recorded.states.get(outcome.lease.deliveryId);
      if (state === undefined) this.counts.skipped += 1; // our lease expired: someone else's now
      else if (!outcome.attempted || outcome.configurationFault) {
        this.counts.countSpared(outcome.configurationFault);
      } else this.counts.count(outcome.outcome, state);
    }
    if (recorded.stopped !== null && this.stopped === null) {
      // A 410 or a refused address disabled the destination in the same statement.
      this.log(`destination ${this.destinationId} disabled: ${recorded.stopped}`);
      this.stopped = recorded.stopped;
    }
  }

  async returnSlots() {
    if (!this.returnedSlots.length) return;
    const slots = this.returnedSlots;
    await this.db('return permits', (c) =>
      run(c, 'release_permits', { destination_id: this.destinationId, slots, holder: this.holder }),
    );
    this.returnedSlots = [];
  }

  // Deferring -------------------------------------------------------------------------------

  /** Hand every unsent message back to pending, due when worth trying: at the end of the
   * destination's pause (as stored), or after the grant's wait.
   * @param {Grant} grant @param {string} [why] */
  async deferRest(grant, why) {
    this.pages.stop();
    const paused = Boolean(grant.reason?.startsWith('paused'));
    const delay = paused ? 0 : grant.retryIn;
    let reason = why ?? `destination ${this.destinationId} ${grant.reason ?? 'unavailable'}`;
    if (paused) reason = `waiting: destination ${grant.reason}`;
    for (;;) {
      await this.refill();
      if (!this.waiting.length) return;
      const chunk = this.waiting.splice(0);
      const rows = await this.db('defer', (c) =>
        run(c, 'defer_deliveries', {
          delivery_ids: chunk.map((m) => m.delivery_id),
          message_ids: chunk.map((m) => m.message_id),
          delay_seconds: delay,
          reason,
        }),
      );
      this.counts.deferred += rows.length;
    }
  }

  // The loop --------------------------------------------------------------------------------

  /** @param {Grant} grant */
  shouldGiveUp(grant) {
    if (grant.reason === 'disabled') return true;
    const at = now();
    this.waitStarted ??= at;
    return at + grant.retryIn > this.waitStarted + this.maxWaitSeconds;
  }

  /** @returns {Promise<DeliveryCounts>} */
  async run() {
    let failure = null;
    try {
      await this.refreshDestination();
      await this.db('read the database clock', (c) => this.clock.calibrate(c));
      await this.loop();
    } catch (error) {
      failure = error;
      throw error;
    } finally {
      await this.settle(failure);
    }
    return this.counts;
  }

  async loop() {
    for (;;) {
      if (now() - this.refreshedAt >= REFRESH_SECONDS) await this.refreshDestination();
      if (this.signal.aborted) {
        await this.deferRest(emptyGrant(), `due again: run ${this.runId} was stopped`);
        return;
      }
      await this.refill();
      if (!this.waiting.length && !this.inFlight.size) return;
      if (this.stopped !== null && !this.inFlight.size) {
        await this.deferRest(
          emptyGrant(DISABLED_POLL_SECONDS),
          `waiting: destination ${this.destinationId} is disabled (${this.stopped})`,
        );
        return;
      }
      let grant;
      let used = 0;
      if (this.stopped !== null) grant = emptyGrant();
      else if (now() >= this.nextAskAt) [grant, used] = await this.step();
      else grant = this.grant; // not worth asking yet (askDelay)
      if (used) {
        this.waitStarted = null;
        continue;
      }
      if (this.waiting.length && !this.inFlight.size && this.shouldGiveUp(grant)) {
        await this.deferRest(grant);
        return;
      }
      if (this.inFlight.size) await this.collect(this.waitBound(grant));
      else {
        if (this.finished.length) await this.record();
        await stopWait(Math.max(this.nextAskAt - now(), 0.001), this.signal);
      }
    }
  }

  // Handing back ----------------------------------------------------------------------------

  /** However the worker ends: every request in flight is waited for and taken, a lease never
   * sent is recorded as not started, every outcome is recorded (unless the database refused
   * them outright), every permit goes back, and the senders are closed. After a failure, a
   * further failure here is logged and the first one is thrown.
   * @param {unknown} failure */
  async settle(failure) {
    try {
      try {
        for (const [lease, slot] of this.unsent) {
          this.finished.push([notSent(lease, failure ?? new Error('stopped')), null]);
          this.returnedSlots.push(slot);
        }
        this.unsent = [];
        while (this.inFlight.size) {
          // A send ends within its timeouts.
          for (const [deliveryId, result] of await this.answers.take(null, null)) {
            this.take(deliveryId, result);
          }
        }
        if (this.finished.length && !this.recordRefused) await this.record();
      } finally {
        await this.returnSlots();
      }
    } catch (error) {
      if (failure === null) throw error;
      this.log(
        `delivery to ${this.destinationId} in run ${this.runId}: handing back after ` +
          `${failure?.message ?? failure} failed too: ${error?.message ?? error}`,
      );
    } finally {
      for (const sender of [...this.retired, this.sender]) sender?.close();
    }
  }
}

/**
 * @typedef {object} DestinationResult
 * @property {string} destinationId
 * @property {number} claimed
 * @property {DeliveryCounts} counts
 * @property {number} seconds
 * @property {unknown} [error] the failure that ended this destination's worker, if any
 */

/**
 * Deliver the due work of each destination concurrently, each worker on a connection of its
 * own, claiming its own pages (none waits behind another's backlog), at most `maxRows` rows in
 * all. One worker's failure does not stop the others; every result (with its error) comes
 * back once all have ended.
 * @param {{settings: import('./config.js').Settings, runId: string, destinationIds: string[],
 *   pageSize?: number, maxRows?: number | null, maxWaitSeconds?: number, signal?: AbortSignal,
 *   log?: (line: string) => void}} options
 * @returns {Promise<DestinationResult[]>}
 */
export async function deliverDestinations({
  settings,
  runId,
  destinationIds,
  pageSize = DEFAULT_PAGE_SIZE,
  maxRows = null,
  maxWaitSeconds = DEFAULT_MAX_WAIT_SECONDS,
  signal = new AbortController().signal,
  log = () => {},
}) {
  const budget = new RowBudget(maxRows);
  const one = async (destinationId) => {
    const started = now();
    const pages = new DuePages(runId, destinationId, pageSize, budget, { log });
    let worker = null;
    let client = null;
    const result = () => ({
      destinationId,
      claimed: pages.claimed,
      counts: worker?.counts ?? new DeliveryCounts(),
      seconds: now() - started,
    });
    try {
      client = await connect(settings.databaseUrl, 'worker', settings);
      worker = new DestinationWorker({ client, runId, pages, settings, maxWaitSeconds, signal, log });
      await worker.run();
      return result();
    } catch (error) {
      return { ...result(), error };
    } finally {
      await client?.end().catch(() => {});
    }
  };
  return Promise.all(destinationIds.map(one));
}

/**
 * Check, before any work, that the database is reachable, its schema current, and every
 * destination known; throws RuntimeFailure or UserError (one line each).
 * @param {import('./config.js').Settings} settings
 * @param {string[]} destinationIds
 */
export async function preflight(settings, destinationIds) {
  const client = await connect(settings.databaseUrl, 'worker', settings);
  try {
    await requireCurrent(client);
    for (const destinationId of destinationIds) {
      const rows = await run(client, 'destination_get', { destination_id: destinationId });
      if (!rows.length) throw new UserError(`no destination '${destinationId}'`);
    }
  } finally {
    await client.end().catch(() => {});
  }
}
