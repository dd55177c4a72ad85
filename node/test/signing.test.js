import assert from 'node:assert/strict';
import { test } from 'node:test';

import { InvalidSecret, decodeSecret, sign, verify, VerificationError } from '../src/signing.js';
import { vectors } from './vectors.js';

const { cases, secrets } = vectors('signing');

test('signatures are the Python signer\'s, byte for byte (shared vectors)', () => {
  for (const c of cases) {
    const body = Buffer.from(c.body_base64, 'base64');
    assert.equal(sign(c.secrets, c.msg_id, c.timestamp, body), c.signature);
  }
});

test('a signed request verifies, and a changed body or an old timestamp does not', () => {
  const c = cases[1];
  const body = Buffer.from(c.body_base64, 'base64');
  const headers = {
    'webhook-id': c.msg_id,
    'webhook-timestamp': String(c.timestamp),
    'webhook-signature': c.signature,
  };
  verify(c.secrets.slice(-1), headers, body, { now: c.timestamp + 10 });
  assert.throws(
    () => verify(c.secrets, headers, Buffer.concat([body, Buffer.from(' ')]), { now: c.timestamp }),
    VerificationError,
  );
  assert.throws(() => verify(c.secrets, headers, body, { now: c.timestamp + 301 }), /tolerance/);
});

test('malformed secrets are refused with the Python messages, never showing the secret', () => {
  for (const { secret, error, key_hex: keyHex } of secrets) {
    if (error === null) {
      assert.equal(decodeSecret(secret).toString('hex'), keyHex, secret);
      continue;
    }
    assert.throws(() => decodeSecret(secret), (e) => e instanceof InvalidSecret && e.message === error, secret);
  }
});
