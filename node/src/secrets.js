/**
 * Signing secrets at rest (media_hooks/store/secret_store.py): stored as given (`whsec_…`), or as
 * `fernet:<token>`, encrypted under the first key of MEDIA_HOOKS_SECRET_KEY (comma-separated
 * Fernet keys; every one decrypts). The worker only opens them, where a destination is read
 * for sending. Fernet is AES-128-CBC with an HMAC-SHA256 over the token (the `cryptography`
 * package's format, implemented here with node:crypto). A key never appears in a message.
 */

import { createDecipheriv, createHmac, timingSafeEqual } from 'node:crypto';

import { RuntimeFailure, UserError } from './errors.js';

export const ENV = 'MEDIA_HOOKS_SECRET_KEY';
export const SEALED_PREFIX = 'fernet:';
const URLSAFE_BASE64 = /^[A-Za-z0-9_-]*={0,2}$/;

/** Stored secrets cannot be read: no key, or none of the keys opens them (exit 1). */
export class SecretKeyError extends RuntimeFailure {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'SecretKeyError';
  }
}

/**
 * @param {string} text url-safe base64
 * @returns {Buffer | null}
 */
function urlsafe(text) {
  if (!URLSAFE_BASE64.test(text) || text.replace(/=+$/, '').length % 4 === 1) return null;
  return Buffer.from(text, 'base64url');
}

/**
 * The keys of MEDIA_HOOKS_SECRET_KEY (none: secrets are stored as given).
 * @param {string | undefined} raw
 * @returns {{signing: Buffer, encryption: Buffer}[]}
 */
export function parseKeys(raw) {
  const text = (raw ?? '').trim();
  if (!text) return [];
  const parts = text.split(',').map((p) => p.trim());
  return parts.map((part, i) => {
    const key = urlsafe(part);
    if (key === null || key.length !== 32) {
      throw new UserError(
        `${ENV}: key ${i + 1} of ${parts.length} is not a Fernet key (32 bytes in url-safe ` +
          'base64; make one with `media-hooks secrets generate-key`)',
      );
    }
    return { signing: key.subarray(0, 16), encryption: key.subarray(16) };
  });
}

/**
 * A Fernet token's plaintext under one key, or null if the key does not open it.
 * @param {Buffer} token
 * @param {{signing: Buffer, encryption: Buffer}} key
 */
function decrypt(token, key) {
  if (token.length < 1 + 8 + 16 + 16 + 32 || token[0] !== 0x80) return null;
  const signed = token.subarray(0, token.length - 32);
  const mac = createHmac('sha256', key.signing).update(signed).digest();
  if (!timingSafeEqual(mac, token.subarray(token.length - 32))) return null;
  try {
    const decipher = createDecipheriv('aes-128-cbc', key.encryption, token.subarray(9, 25));
    return Buffer.concat([decipher.update(token.subarray(25, token.length - 32)), decipher.final()]);
  } catch {
    return null;
  }
}

/**
 * The secret as given, from how it is stored; `owner` names it in errors.
 * @param {string} stored
 * @param {{signing: Buffer, encryption: Buffer}[]} keys
 * @param {string} owner
 */
export function openSecret(stored, keys, owner) {
  if (!stored.startsWith(SEALED_PREFIX)) return stored;
  if (!keys.length) {
    throw new SecretKeyError(
      `the signing secrets of ${owner} are encrypted, but ${ENV} is not set: set it to ` +
        'the key they were encrypted with',
    );
  }
  const token = urlsafe(stored.slice(SEALED_PREFIX.length));
  for (const key of token ? keys : []) {
    const plain = decrypt(token, key);
    if (plain !== null) {
      const text = new TextDecoder('utf-8', { fatal: true });
      try {
        return text.decode(plain);
      } catch {
        break;
      }
    }
  }
  throw new SecretKeyError(
    `the signing secrets of ${owner} cannot be decrypted with any key in ${ENV} (a wrong ` +
      'key, or an old key removed before `media-hooks secrets rekey` ran: list it after the new one)',
  );
}
