import assert from 'node:assert/strict';
import { test } from 'node:test';

import { UserError } from '../src/errors.js';
import { byCodePoint, payloadJson, pyFloat } from '../src/canonical.js';
import { bodyParts, deriveDeliveryId, eventDeliveryId } from '../src/emit.js';
import { pyRepr, validateIdentifier } from '../src/identifiers.js';
import { vectors } from './vectors.js';

const shared = vectors('canonical');

test('payloads serialize to the Python bytes, with the same derived id and body (shared)', () => {
  for (const c of shared.cases) {
    const payload = JSON.parse(c.payload);
    assert.equal(payloadJson(payload), c.canonical, c.payload);
    assert.equal(deriveDeliveryId('cdn:eu-1', 'rights.updated', 'asset/é 1', payload), c.derived_id);
    const [head, tail] = bodyParts('rights.updated', 'asset/é 1', c.canonical);
    assert.equal(head.toString('utf8'), c.body_head);
    assert.equal(tail.toString('utf8'), c.body_tail);
  }
  for (const e of shared.event_delivery_ids) {
    assert.equal(eventDeliveryId(e.event_id, e.destination_id), e.delivery_id);
  }
});

test('floats are written as Python writes them', () => {
  const cases = [
    [0.1, '0.1'],
    [1e-5, '1e-05'],
    [1.5e-7, '1.5e-07'],
    [1e16, '1e+16'],
    [123456789.125, '123456789.125'],
    [9007199254740994, '9007199254740994.0'],
    [-0, '-0.0'],
    [1e300, '1e+300'],
  ];
  for (const [value, text] of cases) assert.equal(pyFloat(value), text);
});

test('keys sort by code point, as Python sorts str', () => {
  assert.deepEqual(['\uffff', '\u{1d11e}', 'b', 'a'].sort(byCodePoint), ['a', 'b', '\uffff', '\u{1d11e}']);
});

/** @param {unknown} payload @param {string} message */
function refuses(payload, message) {
  assert.throws(() => payloadJson(payload), (e) => e instanceof UserError && e.message === message);
}

test("a payload JSON cannot carry is refused in emit.py's words", () => {
  refuses([], 'payload must be a JSON object, got an array');
  refuses('x', 'payload must be a JSON object, got a string');
  refuses(null, 'payload must be a JSON object, got null');
  refuses(3, 'payload must be a JSON object, got a number');
  refuses({ n: Number.NaN }, 'payload contains NaN or Infinity, which JSON cannot represent');
  refuses({ n: Infinity }, 'payload contains NaN or Infinity, which JSON cannot represent');
  refuses({ d: new Date(0) }, 'payload is not JSON: Object of type Date is not JSON serializable');
  refuses({ u: undefined }, 'payload is not JSON: Object of type undefined is not JSON serializable');
  refuses({ 'k\u0000': 1 }, 'payload contains a NUL character (\\u0000), which PostgreSQL refuses');
  let deep = {};
  for (let i = 0; i < 128; i += 1) deep = { d: deep };
  refuses(deep, 'payload is nested more than 128 levels deep');
  const cyclic = {};
  cyclic.self = cyclic;
  refuses(cyclic, 'payload is nested more than 128 levels deep');
  let allowed = {};
  for (let i = 0; i < 127; i += 1) allowed = { d: allowed };
  assert.ok(payloadJson(allowed).startsWith('{"d":'));
});

test("identifiers are checked in identifiers.py's words, values shown as Python's repr", () => {
  const refused = (value, message) =>
    assert.throws(() => validateIdentifier(value, 'delivery_id'), (e) => e instanceof UserError && e.message === message);
  refused(5, 'delivery_id must be a string, got int');
  refused(null, 'delivery_id must be a string, got NoneType');
  refused('', 'delivery_id must not be empty');
  refused('x'.repeat(201), 'delivery_id is 201 characters long; at most 200 are allowed');
  refused(
    'a.b',
    "delivery_id 'a.b' contains '.': only letters, digits, '_', '-' and ':' are allowed ('.' is reserved by Standard Webhooks)",
  );
  assert.equal(pyRepr("it's"), '"it\'s"');
  assert.equal(pyRepr('tab\there\u00a0\u0007'), "'tab\\there\\xa0\\x07'");
  assert.equal(validateIdentifier('A-z_0:9', 'x'), 'A-z_0:9');
});
