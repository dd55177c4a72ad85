import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ForbiddenAddress, checkAddress, checkHost, guardedLookup, refusal } from '../src/ssrf.js';
import { vectors } from './vectors.js';

test('every address is judged as the Python guard judges it, in the same words (shared)', () => {
  for (const { address, refusal: expected } of vectors('ssrf')) {
    assert.equal(refusal(address), expected, address);
  }
});

test('the opt-in allows what the guard refuses, and only it', () => {
  assert.doesNotThrow(() => checkAddress('127.0.0.1', true));
  assert.throws(
    () => checkAddress('127.0.0.1', false),
    (e) => e instanceof ForbiddenAddress && /set MEDIA_HOOKS_ALLOW_PRIVATE_URLS=1 to allow it$/.test(e.message),
  );
  assert.doesNotThrow(() => checkHost('example.com', false)); // a name is judged at lookup
  assert.throws(() => checkHost('::1', false), /connecting to ::1: ::1 is in ::1\/128/);
});

/** A resolver that answers `addresses` for any name (the lookup's only input). */
const resolvingTo = (addresses) => (hostname, options, callback) =>
  callback(null, addresses.map((address) => ({ address, family: address.includes(':') ? 6 : 4 })));

test('a name resolving to any refused address is refused before the connection', async () => {
  const lookup = guardedLookup('hooks.example', resolvingTo(['93.184.216.34', '10.0.0.7']));
  const error = await new Promise((resolve) => lookup('hooks.example', { all: true }, resolve));
  assert.ok(error instanceof ForbiddenAddress);
  assert.match(error.message, /^connecting to hooks\.example: 10\.0\.0\.7 is in 10\.0\.0\.0\/8/);
});

test('a name resolving to public addresses connects, in both lookup forms', async () => {
  const lookup = guardedLookup('hooks.example', resolvingTo(['93.184.216.34', '2606:2800:220:1::1']));
  const all = await new Promise((resolve) =>
    lookup('hooks.example', { all: true }, (err, addresses) => resolve([err, addresses])),
  );
  assert.deepEqual(all, [null, [
    { address: '93.184.216.34', family: 4 },
    { address: '2606:2800:220:1::1', family: 6 },
  ]]);
  const one = await new Promise((resolve) =>
    lookup('hooks.example', {}, (err, address, family) => resolve([err, address, family])),
  );
  assert.deepEqual(one, [null, '93.184.216.34', 4]);
});

test('a resolution error is passed on as it is', async () => {
  const failing = (hostname, options, callback) =>
    callback(Object.assign(new Error('getaddrinfo ENOTFOUND x'), { code: 'ENOTFOUND' }));
  const error = await new Promise((resolve) => guardedLookup('x', failing)('x', { all: true }, resolve));
  assert.equal(error.code, 'ENOTFOUND');
});
