import assert from 'node:assert/strict';
import { test } from 'node:test';

import { AMBIGUOUS, RETRYABLE, classifyFailure, classifyResponse, parseRetryAfter } from '../src/outcomes.js';
import { vectors } from './vectors.js';

const table = vectors('outcomes');
const NOW = Date.parse(table.now);

test("every answer is classified as the contract's table says (shared with Python)", () => {
  for (const c of table.cases) {
    const headers = c.retry_after === null ? {} : { 'retry-after': c.retry_after };
    const got = classifyResponse(c.status, headers, NOW);
    const where = `${c.status} Retry-After ${c.retry_after}`;
    assert.equal(got.outcome, c.outcome, where);
    assert.equal(got.retryAfterSeconds, c.retry_after_seconds, where);
  }
});

test('Retry-After is parsed, never negative, and not capped here (the database caps it)', () => {
  assert.equal(parseRetryAfter(' 120 ', NOW), 120);
  assert.equal(parseRetryAfter('999999', NOW), 999999);
  assert.equal(parseRetryAfter('Sat, 28 Feb 2026 12:00:00 GMT', NOW), 0);
  assert.equal(parseRetryAfter('Sunday, 01-Mar-26 12:00:30 GMT', NOW), 30);
  assert.equal(parseRetryAfter('Sun Mar  1 12:00:45 2026', NOW), 45);
  assert.ok(Number.isFinite(parseRetryAfter('9'.repeat(400), NOW)));
  for (const junk of ['', 'soon', '-5', '1e3', 'Sun, 01 Foo 2026 12:00:00 GMT']) {
    assert.equal(parseRetryAfter(junk, NOW), null, junk);
  }
});

test('failures before the connection are retryable; after it, ambiguous', () => {
  const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:9'), { code: 'ECONNREFUSED' });
  assert.deepEqual(
    [classifyFailure(refused, { connected: false, timedOut: false }).outcome, classifyFailure(refused, { connected: false, timedOut: false }).requestSent],
    [RETRYABLE, false],
  );
  const dns = Object.assign(new Error('getaddrinfo ENOTFOUND nowhere.invalid'), { code: 'ENOTFOUND' });
  assert.match(classifyFailure(dns, { connected: false, timedOut: false }).error, /^DNS failure: /);
  const slow = new Error('no answer');
  assert.match(classifyFailure(slow, { connected: false, timedOut: true }).error, /^connect timeout/);
  const timeout = classifyFailure(slow, { connected: true, timedOut: true });
  assert.equal(timeout.outcome, AMBIGUOUS);
  assert.match(timeout.error, /^read timeout/);
  const reset = Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' });
  const lost = classifyFailure(reset, { connected: true, timedOut: false });
  assert.equal(lost.outcome, AMBIGUOUS);
  assert.match(lost.error, /^connection lost after the request was sent/);
  const guard = Object.assign(new Error('connecting to x: 127.0.0.1 is in ...'), { code: 'MEDIA_HOOKS_FORBIDDEN_ADDRESS' });
  const fault = classifyFailure(guard, { connected: false, timedOut: false });
  assert.equal(fault.configurationFault, true);
  assert.match(fault.error, /^refused by the SSRF guard: connecting to x/);
});
