/**
 * Standard Webhooks signatures (docs/contract.md, "The HTTP request a receiver gets"), as
 * media_hooks/http/signing.py makes them: `webhook-signature` is space-separated `v1,<base64
 * HMAC-SHA256>` entries, one per active secret, over `"{webhook-id}.{webhook-timestamp}." +
 * body`; a secret is `whsec_<base64 key>`. Secret values never appear in an error's text.
 */

import { createHmac, timingSafeEqual } from 'node:crypto';

import { UserError } from './errors.js';

export const SECRET_PREFIX = 'whsec_';
export const SIGNATURE_VERSION = 'v1';
export const DEFAULT_TOLERANCE_SECONDS = 300;
// Standard base64 with its padding, for the signatures a request offers.
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;
const ALPHABET = /[A-Za-z0-9+/]/;

/**
 * Base64 as Python's b64decode(validate=True) reads it (binascii's strict mode): only the
 * alphabet, no leading pad, nothing after the padding that completes a group, no group one
 * character long; pads where no group is open are passed over. Null when it refuses.
 * @param {string} text
 * @returns {Buffer | null}
 */
export function strictBase64(text) {
  let data = '';
  let quad = 0;
  let pads = 0;
  let paddingStarted = false;
  for (let i = 0; i < text.length; i += 1) {
    const ch = text[i];
    if (ch === '=') {
      if (i === 0) return null;
      paddingStarted = true;
      if (quad >= 2 && quad + ++pads >= 4) return i + 1 < text.length ? null : Buffer.from(data, 'base64');
      continue;
    }
    if (!ALPHABET.test(ch) || paddingStarted) return null;
    data += ch;
    quad = (quad + 1) % 4;
  }
  return quad === 0 ? Buffer.from(data, 'base64') : null;
}

/** A secret that is not `whsec_` followed by non-empty base64. */
export class InvalidSecret extends UserError {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'InvalidSecret';
  }
}

/** A request's signature headers do not verify; the text says why, never with a secret. */
export class VerificationError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'VerificationError';
  }
}

/**
 * The HMAC key of a `whsec_<base64>` secret (missing padding tolerated, as the reference
 * implementation does).
 * @param {string} secret
 * @returns {Buffer}
 */
export function decodeSecret(secret) {
  if (typeof secret !== 'string' || !secret.startsWith(SECRET_PREFIX)) {
    throw new InvalidSecret(`a webhook secret must start with '${SECRET_PREFIX}'`);
  }
  const encoded = secret.slice(SECRET_PREFIX.length);
  const key = strictBase64(encoded + '='.repeat((4 - (encoded.length % 4)) % 4));
  if (key === null) {
    throw new InvalidSecret(`a webhook secret must be ${SECRET_PREFIX} followed by base64`);
  }
  if (key.length === 0) throw new InvalidSecret("a webhook secret's key must not be empty");
  return key;
}

/**
 * @param {Buffer} key
 * @param {string} msgId
 * @param {number} timestamp
 * @param {Buffer} body
 */
function signature(key, msgId, timestamp, body) {
  return createHmac('sha256', key).update(`${msgId}.${timestamp}.`, 'utf8').update(body).digest();
}

/**
 * The `webhook-signature` header value: one `v1,` entry per secret.
 * @param {readonly string[]} secrets
 * @param {string} msgId
 * @param {number} timestamp Unix seconds
 * @param {Buffer} body
 */
export function sign(secrets, msgId, timestamp, body) {
  return secrets
    .map((s) => `${SIGNATURE_VERSION},${signature(decodeSecret(s), msgId, timestamp, body).toString('base64')}`)
    .join(' ');
}

/**
 * Pass if any offered `v1` signature matches any secret, within the timestamp tolerance;
 * throw VerificationError if not.
 * @param {readonly string[]} secrets
 * @param {Record<string, string | string[] | undefined>} headers lower-case names (node:http)
 * @param {Buffer} body
 * @param {{toleranceSeconds?: number, now?: number}} [options]
 */
export function verify(secrets, headers, body, { toleranceSeconds = DEFAULT_TOLERANCE_SECONDS, now } = {}) {
  const header = (name) => {
    const value = headers[name];
    if (value === undefined) throw new VerificationError(`missing ${name} header`);
    return Array.isArray(value) ? value.join(', ') : value;
  };
  const msgId = header('webhook-id');
  const raw = header('webhook-timestamp');
  if (!/^-?\d+$/.test(raw.trim())) {
    throw new VerificationError(`webhook-timestamp '${raw.slice(0, 40)}' is not Unix seconds`);
  }
  const timestamp = Number(raw.trim());
  const current = now ?? Date.now() / 1000;
  if (Math.abs(current - timestamp) > toleranceSeconds) {
    throw new VerificationError('webhook-timestamp is outside the tolerance');
  }
  const offered = header('webhook-signature')
    .split(/\s+/)
    .map((entry) => entry.split(','))
    .filter(([version, encoded]) => version === SIGNATURE_VERSION && encoded && BASE64.test(encoded))
    .map(([, encoded]) => Buffer.from(encoded, 'base64'));
  const expected = secrets.map((s) => signature(decodeSecret(s), msgId, timestamp, body));
  let matched = false;
  for (const candidate of offered) {
    for (const wanted of expected) {
      matched = (candidate.length === wanted.length && timingSafeEqual(candidate, wanted)) || matched;
    }
  }
  if (!matched) throw new VerificationError('no webhook-signature entry matches an active secret');
}
