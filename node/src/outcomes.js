/**
 * The contract's outcome table (docs/contract.md) (media_hooks/http/outcomes.py): what a receiver's answer, or its
 * silence, means. This is all a runtime decides about an attempt; what the class does to the
 * delivery and its destination the database decides (media_hooks_record_outcomes_v1).
 *
 * | receiver answer                                   | outcome                            |
 * |---------------------------------------------------|------------------------------------|
 * | 2xx                                               | success                            |
 * | 429 (Retry-After optional), 503 with Retry-After  | rate_limited                       |
 * | 408, 425, other 5xx                               | retryable                          |
 * | connection refused, DNS failure, connect timeout, | retryable (nothing was sent)       |
 * | TLS handshake                                     |                                    |
 * | SSRF-forbidden peer address                       | retryable, a configuration fault   |
 * | read timeout, connection lost after the request   | ambiguous (the receiver may have   |
 * |                                                   | acted: same key next time)         |
 * | 410                                               | rejected (the database disables    |
 * |                                                   | the destination)                   |
 * | other 4xx, 3xx                                    | rejected                           |
 */

export const SUCCESS = 'success';
export const RATE_LIMITED = 'rate_limited';
export const RETRYABLE = 'retryable';
export const AMBIGUOUS = 'ambiguous';
export const REJECTED = 'rejected';
export const OUTCOMES = [SUCCESS, RATE_LIMITED, RETRYABLE, AMBIGUOUS, REJECTED];

const DELTA_SECONDS = /^\d+(\.\d+)?$/;
const MONTHS = 'Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec'.split(' ');
// RFC 9110's HTTP-date forms: IMF-fixdate (and RFC 1123 with a numeric zone), RFC 850, asctime.
const IMF_DATE =
  /^(?:[A-Za-z]{3},\s*)?(\d{1,2})\s+([A-Za-z]{3})\s+(\d{4})\s+(\d{2}):(\d{2}):(\d{2})\s*(GMT|UT|UTC|Z|[+-]\d{4})?$/;
const RFC850_DATE =
  /^[A-Za-z]+,\s*(\d{1,2})-([A-Za-z]{3})-(\d{2,4})\s+(\d{2}):(\d{2}):(\d{2})\s*(GMT)?$/;
const ASCTIME_DATE = /^[A-Za-z]{3}\s+([A-Za-z]{3})\s+(\d{1,2})\s+(\d{2}):(\d{2}):(\d{2})\s+(\d{4})$/;

/**
 * @param {string} text
 * @returns {number | null} milliseconds since the epoch
 */
function httpDate(text) {
  let day, month, year, hh, mm, ss, zone;
  let m = IMF_DATE.exec(text);
  if (m) [, day, month, year, hh, mm, ss, zone] = m;
  else if ((m = RFC850_DATE.exec(text))) {
    [, day, month, year, hh, mm, ss] = m;
    if (year.length === 2) year = String(Number(year) + (Number(year) < 50 ? 2000 : 1900));
  } else if ((m = ASCTIME_DATE.exec(text))) [, month, day, hh, mm, ss, year] = m;
  else return null;
  const monthIndex = MONTHS.findIndex((name) => name.toLowerCase() === month.toLowerCase());
  if (monthIndex < 0) return null;
  let offsetMinutes = 0;
  if (zone && /^[+-]/.test(zone)) {
    const sign = zone[0] === '-' ? -1 : 1;
    offsetMinutes = sign * (Number(zone.slice(1, 3)) * 60 + Number(zone.slice(3, 5)));
  }
  const utc = Date.UTC(Number(year), monthIndex, Number(day), Number(hh), Number(mm), Number(ss));
  return Number.isNaN(utc) ? null : utc - offsetMinutes * 60_000;
}

/**
 * Seconds to wait from a Retry-After value (delta-seconds or HTTP-date); a date in the past is
 * 0; anything unparseable is null. Not capped here: the database caps it (migration 0017).
 * @param {string | undefined | null} value
 * @param {number} [nowMs]
 * @returns {number | null}
 */
export function parseRetryAfter(value, nowMs = Date.now()) {
  if (value === undefined || value === null) return null;
  const text = value.trim();
  let seconds;
  if (DELTA_SECONDS.test(text)) seconds = Number(text);
  else {
    const when = httpDate(text);
    if (when === null) return null;
    seconds = (when - nowMs) / 1000;
  }
  // A number too long for a double is as long as any: the database's cap decides.
  return Math.min(Math.max(seconds, 0), Number.MAX_VALUE);
}

/**
 * @typedef {object} Classification
 * @property {string} outcome
 * @property {number | null} retryAfterSeconds
 */

/**
 * The outcome of an HTTP answer, with its Retry-After when it carries one. A 429 without a
 * usable Retry-After is still rate_limited; a 503 whose Retry-After does not parse is an
 * ordinary retryable 5xx.
 * @param {number} status
 * @param {Record<string, string | string[] | undefined>} headers lower-case names (node:http)
 * @param {number} [nowMs]
 * @returns {Classification}
 */
export function classifyResponse(status, headers, nowMs) {
  if (status >= 200 && status <= 299) return { outcome: SUCCESS, retryAfterSeconds: null };
  if (status === 429 || status === 503) {
    const raw = headers['retry-after'];
    const retryAfter = parseRetryAfter(Array.isArray(raw) ? raw[0] : raw, nowMs);
    if (status === 429 || retryAfter !== null) {
      return { outcome: RATE_LIMITED, retryAfterSeconds: retryAfter };
    }
    return { outcome: RETRYABLE, retryAfterSeconds: null };
  }
  if (status === 408 || status === 425 || (status >= 500 && status <= 599)) {
    return { outcome: RETRYABLE, retryAfterSeconds: null };
  }
  if (status >= 300 && status <= 499) return { outcome: REJECTED, retryAfterSeconds: null };
  // 1xx as a final answer, or a code outside HTTP's range: a broken server, try again later.
  return { outcome: RETRYABLE, retryAfterSeconds: null };
}

/**
 * @typedef {object} Failure a request that got no HTTP answer
 * @property {string} outcome
 * @property {boolean} requestSent false only when nothing can have reached the receiver
 * @property {string} error
 * @property {boolean} configurationFault the SSRF guard refused the address
 */

const DNS_CODES = new Set(['ENOTFOUND', 'EAI_AGAIN', 'EAI_FAIL', 'EAI_NONAME', 'EAI_NODATA']);

/**
 * The innermost cause's words, e.g. "Error: connect ECONNREFUSED 127.0.0.1:9".
 * @param {any} error
 */
function describe(error) {
  let current = error;
  while (current?.cause instanceof Error) current = current.cause;
  const name = current?.code ? `${current.name} (${current.code})` : current?.name ?? 'Error';
  return `${name}: ${current?.message || 'no message'}`.slice(0, 500);
}

/**
 * The outcome of a request that failed instead of answering. `connected`: whether the
 * connection was made (a keep-alive one counts), so a failure after it may have reached the
 * receiver; `timedOut`: the request's inactivity timeout fired.
 * @param {any} error
 * @param {{connected: boolean, timedOut: boolean}} phase
 * @returns {Failure}
 */
export function classifyFailure(error, { connected, timedOut }) {
  const failure = (outcome, requestSent, text, configurationFault = false) => ({
    outcome,
    requestSent,
    error: text.slice(0, 500),
    configurationFault,
  });
  if (error?.code === 'MEDIA_HOOKS_FORBIDDEN_ADDRESS') {
    return failure(RETRYABLE, false, `refused by the SSRF guard: ${error.message}`, true);
  }
  if (!connected) {
    if (DNS_CODES.has(error?.code)) return failure(RETRYABLE, false, `DNS failure: ${describe(error)}`);
    if (timedOut) return failure(RETRYABLE, false, `connect timeout: ${describe(error)}`);
    if (/^(ERR_TLS|ERR_SSL|CERT_|UNABLE_TO|DEPTH_ZERO|SELF_SIGNED|HOSTNAME_MISMATCH)/.test(error?.code ?? '')) {
      return failure(RETRYABLE, false, `TLS failure: ${describe(error)}`);
    }
    return failure(RETRYABLE, false, `connection failed: ${describe(error)}`);
  }
  if (timedOut) return failure(AMBIGUOUS, true, 'read timeout: the receiver may have acted');
  // Anything else happened with the request (possibly) on the wire: the receiver may have acted,
  // so it is retried with the same key and recorded as ambiguous.
  return failure(AMBIGUOUS, true, `connection lost after the request was sent: ${describe(error)}`);
}
