import assert from 'node:assert/strict';
import { test } from 'node:test';

import { UserError } from '../src/errors.js';
import { outOfRange, plain, settingsFromEnv } from '../src/config.js';

test('numbers are written as numeric.plain writes them', () => {
  const cases = [[86400, '86400'], [0.5, '0.5'], [1e300, '1e+300'], [1e-300, '1e-300'], [1234567.5, '1.23457e+06'], [0.0001234, '0.0001234']];
  for (const [value, text] of cases) assert.equal(plain(value), text);
});

test('settings are read as the Python engine reads them, bad ones named in one line', () => {
  const base = { MEDIA_HOOKS_DATABASE_URL: 'postgresql://u@h/db' };
  const settings = settingsFromEnv(base);
  assert.deepEqual(
    [settings.leaseSeconds, settings.allowPrivateUrls, settings.lockTimeoutSeconds, settings.statementTimeoutSeconds],
    [90, false, 5, 60],
  );
  assert.equal(settingsFromEnv({ ...base, MEDIA_HOOKS_ALLOW_PRIVATE_URLS: '1' }).allowPrivateUrls, true);
  const refused = (env, message) =>
    assert.throws(() => settingsFromEnv(env), (e) => e instanceof UserError && e.message === message);
  refused({}, 'MEDIA_HOOKS_DATABASE_URL is not set: the Node worker needs a PostgreSQL URL (for the embedded server, `media-hooks db url` prints its URL)');
  refused({ ...base, MEDIA_HOOKS_ALLOW_PRIVATE_URLS: 'true' }, "MEDIA_HOOKS_ALLOW_PRIVATE_URLS must be 1 (allow private addresses) or 0 / unset (refuse them), got 'true'");
  refused({ ...base, MEDIA_HOOKS_LEASE_SECONDS: 'nan' }, "MEDIA_HOOKS_LEASE_SECONDS must be a number of seconds greater than 0 and at most 86400, got 'nan'");
  refused({ ...base, MEDIA_HOOKS_LOCK_TIMEOUT_SECONDS: '0' }, "MEDIA_HOOKS_LOCK_TIMEOUT_SECONDS must be a number of seconds at least 0.01 and at most 600, got '0'");
});

test('stored destination settings the engine cannot honour are named for the disabled reason', () => {
  const destination = {
    destination_id: 'cdn', rate_per_second: 1e-300, burst: 10, max_in_flight: 4, timeout_seconds: 10,
    max_attempts: 20, backoff_base_seconds: 5, backoff_cap_seconds: 28800, max_age_seconds: 259200,
  };
  assert.equal(
    outOfRange(destination),
    'settings outside the range the engine can honour: rate 1e-300 (allowed: a number of starts per second at least 0.001 and at most 1000000); fix them with `media-hooks destination add cdn ...`, then enable it',
  );
  assert.equal(outOfRange({ ...destination, rate_per_second: 10 }), null);
});
