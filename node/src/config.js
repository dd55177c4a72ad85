/**
 * Configuration from the environment (docs/contract.md, "Configuration"), read and checked as
 * media_hooks/core/config.py and media_hooks/core/numeric.py read it: every number finite and in its
 * documented range, or one clear error naming the variable.
 */

import { UserError } from './errors.js';
import { pyRepr } from './identifiers.js';
import { parseKeys } from './secrets.js';

export const ALLOW_PRIVATE_URLS = 'MEDIA_HOOKS_ALLOW_PRIVATE_URLS';
const DAY_SECONDS = 86400;

/**
 * A number as Python's `%g` writes it (six significant digits).
 * @param {number} value
 */
function pyG(value) {
  if (!Number.isFinite(value)) return Number.isNaN(value) ? 'nan' : value > 0 ? 'inf' : '-inf';
  if (value === 0) return '0';
  const exponent = Math.floor(Math.log10(Math.abs(Number(value.toPrecision(6)))));
  if (exponent < -4 || exponent >= 6) {
    const [m, e] = value.toExponential(5).split('e');
    const mantissa = m.includes('.') ? m.replace(/0+$/, '').replace(/\.$/, '') : m;
    const n = Number(e);
    return `${mantissa}e${n < 0 ? '-' : '+'}${String(Math.abs(n)).padStart(2, '0')}`;
  }
  const fixed = value.toFixed(Math.max(5 - exponent, 0));
  return fixed.includes('.') ? fixed.replace(/0+$/, '').replace(/\.$/, '') : fixed;
}

/**
 * 86400 rather than 86400.0 or 8.64e+04; other values as %g (numeric.plain).
 * @param {number} value
 */
export function plain(value) {
  if (Number.isFinite(value) && Number.isInteger(value) && Math.abs(value) < 1e15) {
    return String(value);
  }
  return pyG(value);
}

/** A range of allowed values (numeric.Range). */
export class Range {
  /**
   * @param {number} low
   * @param {number} high
   * @param {{lowInclusive?: boolean, integer?: boolean, unit?: string}} [options]
   */
  constructor(low, high, { lowInclusive = false, integer = false, unit = '' } = {}) {
    Object.assign(this, { low, high, lowInclusive, integer, unit });
  }

  describe() {
    let kind = this.integer ? 'a whole number' : 'a number';
    if (this.unit) kind = `${kind} of ${this.unit}`;
    const low = this.lowInclusive ? `at least ${plain(this.low)}` : `greater than ${plain(this.low)}`;
    return `${kind} ${low} and at most ${plain(this.high)}`;
  }

  /** @param {number} value */
  contains(value) {
    const above = this.lowInclusive ? value >= this.low : value > this.low;
    return above && value <= this.high;
  }

  /**
   * Why `value` (a stored number) is refused as `what`; null if allowed.
   * @param {unknown} value
   * @param {string} what
   */
  problem(value, what) {
    const kindOk = typeof value === 'number' && (!this.integer || Number.isInteger(value));
    if (!kindOk) return `${what} must be ${this.describe()}, got ${String(value)}`;
    if (!Number.isFinite(value) || !this.contains(value)) {
      return `${what} must be ${this.describe()}, got ${plain(value)}`;
    }
    return null;
  }
}

export const SECONDS_UP_TO_A_DAY = new Range(0, DAY_SECONDS, { unit: 'seconds' });
export const COUNT = new Range(1, 2 ** 31 - 1, { lowInclusive: true, integer: true });
const LOCK_TIMEOUT = new Range(0.01, 600, { lowInclusive: true, unit: 'seconds' });
const STATEMENT_TIMEOUT = new Range(1, DAY_SECONDS, { lowInclusive: true, unit: 'seconds' });

/**
 * The number written in `raw` if it is in `allowed`; UserError otherwise (numeric.parse).
 * @param {string} raw
 * @param {string} what
 * @param {Range} allowed
 */
export function parseNumber(raw, what, allowed) {
  const text = raw.trim();
  const pattern = allowed.integer ? /^[+-]?\d+$/ : /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;
  const value = pattern.test(text) ? Number(text) : Number.NaN;
  if (!Number.isFinite(value) || !allowed.contains(value)) {
    const shown = raw.length <= 40 ? raw : `${raw.slice(0, 40)}…`;
    throw new UserError(`${what} must be ${allowed.describe()}, got ${pyRepr(shown)}`);
  }
  return value;
}

/**
 * @param {NodeJS.ProcessEnv} env
 * @param {string} name
 * @param {number} fallback
 * @param {Range} allowed
 */
function fromEnv(env, name, fallback, allowed) {
  const raw = env[name];
  if (raw === undefined || !raw.trim()) return fallback;
  return parseNumber(raw, name, allowed);
}

/** @param {NodeJS.ProcessEnv} env */
function allowPrivateUrls(env) {
  const raw = (env[ALLOW_PRIVATE_URLS] ?? '').trim();
  if (!['', '0', '1'].includes(raw)) {
    throw new UserError(
      `${ALLOW_PRIVATE_URLS} must be 1 (allow private addresses) or 0 / unset (refuse ` +
        `them), got ${pyRepr(raw.slice(0, 40))}`,
    );
  }
  return raw === '1';
}

/**
 * @typedef {object} Settings
 * @property {string} databaseUrl
 * @property {number} leaseSeconds
 * @property {boolean} allowPrivateUrls
 * @property {number} lockTimeoutSeconds
 * @property {number} statementTimeoutSeconds
 * @property {{signing: Buffer, encryption: Buffer}[]} secretKeys
 */

/**
 * The worker's settings, or a UserError naming the first bad one.
 * @param {NodeJS.ProcessEnv} [env]
 * @returns {Settings}
 */
export function settingsFromEnv(env = process.env) {
  const databaseUrl = (env.MEDIA_HOOKS_DATABASE_URL ?? '').trim();
  if (!databaseUrl) {
    throw new UserError(
      'MEDIA_HOOKS_DATABASE_URL is not set: the Node worker needs a PostgreSQL URL (for the ' +
        'embedded server, `media-hooks db url` prints its URL)',
    );
  }
  return {
    databaseUrl,
    leaseSeconds: fromEnv(env, 'MEDIA_HOOKS_LEASE_SECONDS', 90, SECONDS_UP_TO_A_DAY),
    allowPrivateUrls: allowPrivateUrls(env),
    lockTimeoutSeconds: fromEnv(env, 'MEDIA_HOOKS_LOCK_TIMEOUT_SECONDS', 5, LOCK_TIMEOUT),
    statementTimeoutSeconds: fromEnv(
      env,
      'MEDIA_HOOKS_STATEMENT_TIMEOUT_SECONDS',
      60,
      STATEMENT_TIMEOUT,
    ),
    secretKeys: parseKeys(env.MEDIA_HOOKS_SECRET_KEY),
  };
}

/**
 * A destination's settings the engine can honour (media_hooks/outbox/destinations.py RANGES): a
 * stored value outside them disables the destination before any send.
 */
export const DESTINATION_RANGES = {
  rate_per_second: ['rate', new Range(0.001, 1_000_000, { lowInclusive: true, unit: 'starts per second' })],
  burst: ['burst', new Range(1, 1_000_000, { lowInclusive: true, integer: true })],
  max_in_flight: ['max in flight', new Range(1, 1000, { lowInclusive: true, integer: true })],
  timeout_seconds: ['timeout', new Range(0.1, 600, { lowInclusive: true, unit: 'seconds' })],
  max_attempts: ['max attempts', new Range(1, 1000, { lowInclusive: true, integer: true })],
  backoff_base_seconds: ['backoff base', new Range(0.1, 86_400, { lowInclusive: true, unit: 'seconds' })],
  backoff_cap_seconds: ['backoff cap', new Range(0.1, 2_592_000, { lowInclusive: true, unit: 'seconds' })],
  max_age_seconds: [
    'maximum delivery age',
    new Range(60, 31_536_000, { lowInclusive: true, unit: 'seconds' }),
  ],
};

/**
 * The stored settings the engine cannot honour, in one line for the destination's disabled
 * reason (destinations.out_of_range); or null.
 * @param {Record<string, any>} destination a webhook_destination row
 */
export function outOfRange(destination) {
  const wrong = Object.entries(DESTINATION_RANGES)
    .filter(([name, [what, allowed]]) => allowed.problem(destination[name], what))
    .map(([name, [what, allowed]]) => `${what} ${plain(destination[name])} (allowed: ${allowed.describe()})`);
  if (!wrong.length) return null;
  return (
    `settings outside the range the engine can honour: ${wrong.join(', ')}; fix them with ` +
    `\`media-hooks destination add ${destination.destination_id} ...\`, then enable it`
  );
}
