/**
 * Identifiers users choose (docs/contract.md, "Identifiers"), and the Python spellings the errors
 * of media_hooks/core/identifiers.py and media_hooks/outbox/emit.py use, so that a Node producer gets the
 * same message for the same mistake.
 */

import { UserError } from './errors.js';

export const MAX_IDENTIFIER_LENGTH = 200;
const ALLOWED = /^[A-Za-z0-9_:-]+$/;
const FIRST_BAD = /[^A-Za-z0-9_:-]/u;
// Python's str.isprintable() is false for these categories (and true for ' ').
const UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]/u;

/**
 * The length Python's len() gives: code points, not UTF-16 units.
 * @param {string} text
 */
export function codePoints(text) {
  let n = 0;
  for (const _ of text) n += 1;
  return n;
}

/**
 * Python's repr() of a str, for messages.
 * @param {string} text
 * @returns {string}
 */
export function pyRepr(text) {
  const quote = text.includes("'") && !text.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of text) {
    const code = ch.codePointAt(0);
    if (ch === '\\' || ch === quote) out += `\\${ch}`;
    else if (ch === '\t') out += '\\t';
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (ch !== ' ' && UNPRINTABLE.test(ch)) {
      if (code <= 0xff) out += `\\x${code.toString(16).padStart(2, '0')}`;
      else if (code <= 0xffff) out += `\\u${code.toString(16).padStart(4, '0')}`;
      else out += `\\U${code.toString(16).padStart(8, '0')}`;
    } else out += ch;
  }
  return out + quote;
}

/**
 * The name Python's type() would give a value decoded from JSON, for messages.
 * @param {unknown} value
 */
export function pyTypeName(value) {
  if (value === null || value === undefined) return 'NoneType';
  if (typeof value === 'boolean') return 'bool';
  if (typeof value === 'number') return Number.isInteger(value) ? 'int' : 'float';
  if (typeof value === 'bigint') return 'int';
  if (typeof value === 'string') return 'str';
  if (Array.isArray(value)) return 'list';
  if (typeof value === 'object') {
    const proto = Object.getPrototypeOf(value);
    return proto === Object.prototype || proto === null ? 'dict' : value.constructor?.name ?? 'object';
  }
  return typeof value;
}

/**
 * `value` if it is a valid identifier, else a UserError naming `what` and why.
 * @param {unknown} value
 * @param {string} what
 * @returns {string}
 */
export function validateIdentifier(value, what) {
  if (typeof value !== 'string') {
    throw new UserError(`${what} must be a string, got ${pyTypeName(value)}`);
  }
  if (!value) throw new UserError(`${what} must not be empty`);
  const length = codePoints(value);
  if (length > MAX_IDENTIFIER_LENGTH) {
    throw new UserError(
      `${what} is ${length} characters long; at most ${MAX_IDENTIFIER_LENGTH} are allowed`,
    );
  }
  if (!ALLOWED.test(value)) {
    const bad = FIRST_BAD.exec(value);
    const char = bad ? bad[0] : '?';
    throw new UserError(
      `${what} ${pyRepr(value)} contains ${pyRepr(char)}: only letters, digits, '_', '-' and ':' ` +
        "are allowed ('.' is reserved by Standard Webhooks)",
    );
  }
  return value;
}
