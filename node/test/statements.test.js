import assert from 'node:assert/strict';
import { test } from 'node:test';

import { bind, contractVersions, isContract, loadStatements, migrationVersions, parseQueries, translate } from '../src/statements.js';

test('a queries file splits at its name lines, as sqlfiles.parse_queries does', () => {
  const text = '-- header\n\n-- name: first\n-- description: x\nSELECT 1;\n\n-- name: second_one\nSELECT 2;;\n';
  assert.deepEqual([...parseQueries(text)], [
    ['first', '-- description: x\nSELECT 1'],
    ['second_one', 'SELECT 2'],
  ]);
  assert.throws(() => parseQueries('-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;'), /defined twice/);
});

test('named parameters become positional ones, a name used twice keeping its number', () => {
  const statement = translate(
    'q',
    "-- description: 4% of rows, %(not_a_param)s in prose\nSELECT %(a)s, %(b)s::text[], %(a)s WHERE x LIKE 'f:%%'",
  );
  assert.equal(statement.text, "SELECT $1, $2::text[], $1 WHERE x LIKE 'f:%'");
  assert.deepEqual(statement.params, ['a', 'b']);
  assert.throws(() => translate('q', 'SELECT 5 % 2'), /neither %\(name\)s nor %%/);
});

test("the project's statements load, each with the parameters Python passes", () => {
  const statements = loadStatements();
  assert.ok(statements.size > 50);
  assert.deepEqual(statements.get('record_classified_outcomes').params, ['outcomes']);
  assert.deepEqual(statements.get('lease_with_permits').params, [
    'destination_id',
    'holder',
    'hold_seconds',
    'slot_poll_seconds',
    'disabled_poll_seconds',
    'ahead_seconds',
    'release_slots',
    'run_id',
    'delivery_ids',
    'message_ids',
  ]);
  for (const statement of statements.values()) {
    assert.doesNotMatch(statement.text, /%\(/, statement.name);
    assert.ok(statement.text.trim(), statement.name);
  }
});

test('a statement is bound by name, and a missing parameter is an error', () => {
  const bound = bind('release_permits', { destination_id: 'cdn', slots: [1, 2], holder: 'run-1' });
  assert.deepEqual(bound.values, ['cdn', [1, 2], 'run-1']);
  assert.match(bound.text, /media_hooks_release_permits_v1\(\$1, \$2, \$3\)/);
  assert.throws(() => bind('release_permits', { destination_id: 'cdn' }), /needs parameter 'slots'/);
  assert.throws(() => bind('no_such_statement'), /no statement named/);
});

test('the migrations this checkout defines are read from their file names', () => {
  const versions = migrationVersions();
  assert.equal(versions[0], 1);
  assert.ok(versions.includes(17));
  assert.deepEqual(versions, [...versions].sort((a, b) => a - b));
});

test('a contract migration is told by the directive in its leading comments, as sqlfiles.py reads it', () => {
  assert.equal(isContract('-- migrate: no-transaction\n--  migrate:  contract \nDROP INDEX i;'), true);
  assert.equal(isContract('-- migrate: no-transaction\nDROP INDEX i;'), false);
  assert.equal(isContract('SELECT 1;\n-- migrate: contract\n'), false);
  assert.ok(contractVersions().size >= 1);
});
