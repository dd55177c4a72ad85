import assert from 'node:assert/strict';
import { test } from 'node:test';

import { UserError } from '../src/errors.js';
import { SecretKeyError, openSecret, parseKeys } from '../src/secrets.js';
import { vectors } from './vectors.js';

const fernet = vectors('fernet');

test("a secret encrypted by Python's Fernet opens with its key, among others", () => {
  const keys = parseKeys(`${fernet.other_key}, ${fernet.key}`);
  assert.equal(openSecret(fernet.stored, keys, "destination 'cdn'"), fernet.secret);
  assert.equal(openSecret(fernet.secret, [], "destination 'cdn'"), fernet.secret);
});

test('without the key, or with a wrong one, the message says which setting to fix', () => {
  assert.throws(() => openSecret(fernet.stored, [], "destination 'cdn'"), (e) =>
    e instanceof SecretKeyError && /are encrypted, but MEDIA_HOOKS_SECRET_KEY is not set/.test(e.message));
  assert.throws(() => openSecret(fernet.stored, parseKeys(fernet.other_key), "destination 'cdn'"), (e) =>
    e instanceof SecretKeyError && /cannot be decrypted with any key/.test(e.message) && !e.message.includes(fernet.other_key));
  assert.throws(() => parseKeys('not-a-key'), (e) =>
    e instanceof UserError && e.message.startsWith('MEDIA_HOOKS_SECRET_KEY: key 1 of 1 is not a Fernet key'));
});
