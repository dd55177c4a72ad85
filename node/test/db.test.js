import assert from 'node:assert/strict';
import { test } from 'node:test';

import { busyCause, connectionConfig, preciseSeconds, redact, schemaProblem, sessionName, sessionSettings } from '../src/db.js';
import { migrationVersions } from '../src/statements.js';

test("a worker's session carries its role's bounds, as media_hooks/store/db.py sets them", () => {
  assert.deepEqual(sessionSettings('worker', { statementTimeoutSeconds: 60, lockTimeoutSeconds: 5 }), {
    statement_timeout: '60000',
    lock_timeout: '5000',
    idle_in_transaction_session_timeout: '60000',
  });
  assert.equal(sessionSettings('producer', { statementTimeoutSeconds: 60, lockTimeoutSeconds: 0.01 }).lock_timeout, '10');
});

test('a URL or a libpq key=value string connects, the role\'s options added to its own', () => {
  assert.deepEqual(connectionConfig("host=/tmp/pg port=5433 dbname=x user=u password='a b\\'c' options='-c x=1'", '-c y=2'), {
    host: '/tmp/pg',
    port: '5433',
    database: 'x',
    user: 'u',
    password: "a b'c",
    options: '-c x=1 -c y=2',
  });
  const url = new URL(connectionConfig('postgresql://u@h:1/db?options=-c%20x%3D1', '-c y=2').connectionString);
  assert.equal(url.searchParams.get('options'), '-c x=1 -c y=2');
  assert.throws(() => connectionConfig('nonsense', ''), /not a PostgreSQL URL/);
});

test('a password never shows in a message', () => {
  assert.equal(redact('postgresql://u:hunter2@h/db'), 'postgresql://u:***@h/db');
  assert.equal(redact("host=h password='hunter 2' dbname=d"), 'host=h password=*** dbname=d');
});

test('timestamps keep their microseconds, whatever the session time zone', () => {
  assert.equal(preciseSeconds('2026-12-04 19:55:42.123456+00'), 1796414142.123456);
  assert.equal(preciseSeconds('2026-12-04 21:55:42.123456+02'), 1796414142.123456);
  assert.equal(preciseSeconds('2026-12-04 14:25:42.5-05:30'), 1796414142.5);
});

test('locks, timeouts and conflicts are retried; anything else is not', () => {
  assert.match(busyCause({ code: '55P03' }), /lock_timeout/);
  assert.match(busyCause({ code: '57014', message: 'canceling statement due to statement timeout' }), /statement_timeout/);
  assert.equal(busyCause({ code: '57014', message: 'canceling statement due to user request' }), null);
  assert.match(busyCause({ code: '40P01' }), /deadlock/);
  assert.equal(busyCause({ code: '23505' }), null);
});

test("a session names its role and this release's schema generation, as db.py's session_name does", () => {
  assert.equal(sessionName('worker'), `media_hooks:worker:g${Math.max(...migrationVersions())}`);
  assert.match(sessionName('sweeps'), /^media_hooks:sweeps:g\d+$/);
});

test('contract migrations pending at the end let this release run; one of its own behind them does not', () => {
  const upTo = (n) => new Set(Array.from({ length: n }, (_, i) => i + 1));
  const versions = Array.from({ length: 31 }, (_, i) => i + 1);
  // A release whose migrations end with contract migrations runs while they wait.
  assert.equal(schemaProblem(upTo(29), versions.slice(0, 30), new Set([30])), null);
  assert.equal(schemaProblem(upTo(30), versions.slice(0, 30), new Set([30])), null);
  // One that has a migration of its own after them waits for them, and says why.
  assert.equal(
    schemaProblem(upTo(29), versions, new Set([30])),
    'the database has pending migrations (0030, 0031): run `media-hooks db migrate`, which applies 0030 ' +
      'and those after it once no session of a release before it is connected',
  );
  assert.equal(schemaProblem(upTo(30), versions, new Set([30])), 'the database has pending migrations (0031): run `media-hooks db migrate`');
  assert.equal(schemaProblem(new Set(), versions, new Set([30])), 'the database has no media_hooks schema: run `media-hooks db migrate`');
});
