/**
 * Canonical JSON exactly as the Python producer writes it (media_hooks/outbox/emit.py, `_CANONICAL`:
 * compact separators, keys sorted, UTF-8 as is, no NaN or Infinity), so that an event emitted
 * from Node and the same event emitted from Python give the same payload bytes, the same request
 * body and the same derived delivery_id.
 *
 * JavaScript has one number type where Python has two: a number that is a safe integer is
 * written as Python writes an int (`5`), any other as Python writes a float (`0.5`, `1e+16`,
 * `9007199254740994.0`); a BigInt as an int. So `{"n": 1.0}` parsed by Python (a float, `1.0`)
 * and `{n: 1}` from JavaScript differ: a JavaScript value cannot say which it was.
 */

import { UserError } from './errors.js';

export const MAX_PAYLOAD_DEPTH = 128;
// Python refuses to convert integers longer than this (sys.get_int_max_str_digits()).
const MAX_INT_DIGITS = 4300;
const LONE_SURROGATE = /\p{Cs}/u;

/**
 * A string as Python's json.encoder.encode_basestring writes it (ensure_ascii off): `"`, `\`
 * and control characters escaped, everything else as it is. (JSON.stringify escapes the same
 * set; a lone surrogate, which it would escape, is refused by the caller first.)
 * @param {string} text
 */
export function quote(text) {
  return JSON.stringify(text);
}

/**
 * Whether `text` holds a lone surrogate: text Python cannot encode as UTF-8.
 * @param {string} text
 */
export function hasLoneSurrogate(text) {
  return LONE_SURROGATE.test(text);
}

/**
 * Compare two strings by code point, as Python sorts str (not by UTF-16 unit).
 * @param {string} a
 * @param {string} b
 */
export function byCodePoint(a, b) {
  const x = [...a];
  const y = [...b];
  for (let i = 0; i < Math.min(x.length, y.length); i += 1) {
    const d = x[i].codePointAt(0) - y[i].codePointAt(0);
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

/**
 * A float as Python's repr() writes it: the shortest digits that round-trip, fixed notation
 * for decimal exponents from -4 to 15 (with `.0` when integral), else `d.ddde+XX`.
 * @param {number} value a finite number
 */
export function pyFloat(value) {
  if (Object.is(value, -0)) return '-0.0';
  const [mantissa, exponentText] = value.toExponential().split('e');
  const exponent = Number(exponentText);
  const negative = mantissa.startsWith('-');
  const digits = mantissa.replace('-', '').replace('.', '');
  const sign = negative ? '-' : '';
  if (exponent < -4 || exponent >= 16) {
    const body = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    const e = Math.abs(exponent).toString().padStart(2, '0');
    return `${sign}${body}e${exponent < 0 ? '-' : '+'}${e}`;
  }
  if (exponent < 0) return `${sign}0.${'0'.repeat(-exponent - 1)}${digits}`;
  const whole = digits.slice(0, exponent + 1).padEnd(exponent + 1, '0');
  const fraction = digits.slice(exponent + 1);
  return `${sign}${whole}.${fraction || '0'}`;
}

/**
 * A number as the Python producer writes the value JSON gave it.
 * @param {number} value
 */
function pyNumber(value) {
  if (!Number.isFinite(value)) {
    throw new UserError('payload contains NaN or Infinity, which JSON cannot represent');
  }
  if (Number.isSafeInteger(value)) return String(value);
  return pyFloat(value);
}

/** @param {unknown} value */
function isPlainObject(value) {
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return false;
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

/** @param {unknown} value */
function typeName(value) {
  if (value === undefined) return 'undefined';
  if (typeof value === 'function') return 'function';
  if (typeof value === 'symbol') return 'symbol';
  return value?.constructor?.name ?? typeof value;
}

/**
 * What JSON type a value is, in the words of emit.py's `_json_type`.
 * @param {unknown} value
 */
export function jsonType(value) {
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'string') return 'a string';
  if (typeof value === 'boolean') return 'a boolean';
  if (value === null) return 'null';
  if (typeof value === 'number' || typeof value === 'bigint') return 'a number';
  return typeName(value);
}

/**
 * Whether `value` nests containers more than `limit` deep (iteratively: a cyclic value is
 * simply too deep).
 * @param {unknown} value
 * @param {number} limit
 */
function nestedDeeperThan(value, limit) {
  const stack = [[value, 1]];
  while (stack.length) {
    const [current, depth] = stack.pop();
    const children = Array.isArray(current)
      ? current
      : current !== null && typeof current === 'object'
        ? Object.values(current)
        : null;
    if (children === null) continue;
    if (depth > limit) return true;
    for (const child of children) {
      if (child !== null && typeof child === 'object') stack.push([child, depth + 1]);
    }
  }
  return false;
}

/** @param {unknown} value @returns {string} */
function write(value) {
  if (value === null) return 'null';
  if (value === true) return 'true';
  if (value === false) return 'false';
  if (typeof value === 'string') return quote(value);
  if (typeof value === 'number') return pyNumber(value);
  if (typeof value === 'bigint') {
    const text = value.toString();
    if (text.replace('-', '').length > MAX_INT_DIGITS) {
      throw new UserError('payload has a number with too many digits');
    }
    return text;
  }
  if (Array.isArray(value)) return `[${value.map(write).join(',')}]`;
  if (isPlainObject(value)) {
    const keys = Object.keys(value).sort(byCodePoint);
    return `{${keys.map((k) => `${quote(k)}:${write(value[k])}`).join(',')}}`;
  }
  throw new UserError(
    `payload is not JSON: Object of type ${typeName(value)} is not JSON serializable`,
  );
}

/** @param {unknown} value */
function containsNul(value) {
  if (typeof value === 'string') return value.includes('\u0000');
  if (Array.isArray(value)) return value.some(containsNul);
  if (isPlainObject(value)) {
    return Object.entries(value).some(([k, v]) => k.includes('\u0000') || containsNul(v));
  }
  return false;
}

/**
 * A payload's canonical JSON text, or a UserError naming what makes it unusable.
 * @param {unknown} payload
 * @returns {string}
 */
export function payloadJson(payload) {
  if (!isPlainObject(payload)) {
    throw new UserError(`payload must be a JSON object, got ${jsonType(payload)}`);
  }
  if (nestedDeeperThan(payload, MAX_PAYLOAD_DEPTH)) {
    throw new UserError(`payload is nested more than ${MAX_PAYLOAD_DEPTH} levels deep`);
  }
  const text = write(payload);
  if (text.includes('\\u0000') && containsNul(payload)) {
    throw new UserError('payload contains a NUL character (\\u0000), which PostgreSQL refuses');
  }
  return text;
}
